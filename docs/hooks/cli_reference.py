"""MkDocs hook: the command-line reference, written from tuner.cli's parser at build time.

cli.md holds the prose and the marker below; every build replaces the marker with every command
and every option as argparse knows them, so the page cannot drift from the code. A command's
options that depend on --family (dtypes, problem sizes, bench shapes) are listed per family."""

from __future__ import annotations

import argparse

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page, **_) -> str:
    if page.file.src_uri != "cli.md":
        return markdown
    return markdown.replace(MARKER, reference())


def reference() -> str:
    """The generated part of cli.md, as Markdown."""
    from tuner import families
    from tuner.cli import main as cli

    names = families.names()
    parsers = {name: cli.parser(name) for name in names}
    default = parsers[families.DEFAULT]
    out = ["## Global options", "", "`tuner [--debug] COMMAND ...`", "", *_table(_options(default)), ""]
    for command, sub in _commands(default).items():
        out += [f"## tuner {command}", "", _help(default, command), "",
                "```text", _usage(sub), "```", ""]
        per_family = {name: _options(_commands(p)[command]) for name, p in parsers.items()}
        # an option counts as common where every family has it with the same help
        common = set.intersection(*(set(opts.items()) for opts in per_family.values()))
        out += _table({k: v for k, v in per_family[families.DEFAULT].items() if (k, v) in common})
        for name in names:
            own = {k: v for k, v in per_family[name].items() if (k, v) not in common}
            if own:
                out += ["", f"With `--family {name}`:", "", *_table(own)]
        out.append("")
    return "\n".join(out)


def _commands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(p.commands.choices)


def _help(p: argparse.ArgumentParser, command: str) -> str:
    for action in p.commands._choices_actions:
        if action.dest == command:
            return _sentence(action.help)
    return ""


def _usage(sub: argparse.ArgumentParser) -> str:
    lines = sub.format_usage().removeprefix("usage: ").rstrip().splitlines()
    return "\n".join([lines[0], *(line.removeprefix(" " * len("usage: ")) for line in lines[1:])])


def _options(p: argparse.ArgumentParser) -> dict[str, tuple[str, str]]:
    """Option strings -> (what it takes, help), in the parser's order; hidden options left out."""
    formatter = p._get_formatter()
    found = {}
    for action in p._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        key = ", ".join(f"`{s}`" for s in action.option_strings)
        found[key] = (_takes(action), _sentence(formatter._expand_help(action) if action.help else ""))
    return found


def _takes(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "flag"
    if action.choices:
        what = " \\| ".join(f"`{c}`" for c in action.choices)
    else:
        what = f"`{action.metavar or action.dest.upper()}`"
    if action.required:
        return f"{what} (required)"
    if action.default not in (None, argparse.SUPPRESS):
        default = ",".join(map(str, action.default)) if isinstance(action.default, tuple) else action.default
        return f"{what}, default `{default}`"
    return what


def _sentence(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def _table(options: dict[str, tuple[str, str]]) -> list[str]:
    rows = ["| option | takes | what it does |", "| --- | --- | --- |"]
    return rows + [f"| {key} | {takes} | {text} |" for key, (takes, text) in options.items()]
