"""The command line: `tuner <command>` (`main`: the parser and the commands), its shared options
and checks (`args`), the family part, problem and study a command names (`target`), and the
commands of builds (`build`), studies (`studies`) and captured problems (`problems`)."""
