"""One exception hierarchy for the project: errors in the user's request or setup."""

from __future__ import annotations


class TunerError(Exception):
    """Base class: the CLI prints these as a message and exits non-zero."""


class UsageError(TunerError):
    """The command line asks for something it cannot mean (a required option missing): exit 2, as
    the parser's own usage errors."""


class ToolchainError(TunerError):
    """The CUDA toolkit or a compiler is missing or unusable."""


class GpuError(TunerError):
    """Unknown GPU name, no GPU attached, or the attached GPU is not the one asked for."""


class GpuNameError(GpuError, UsageError):
    """An unknown GPU name or architecture on the command line, or neither where one is needed:
    exit 2, as other usage errors."""


class SpaceError(TunerError):
    """A variant or parameter value outside the family's search space."""


class ProblemError(TunerError, ValueError):
    """A Problem's field of the wrong type or outside its range (one built in Python: the command
    line's parsers refuse the same values)."""


class DtypeError(SpaceError, UsageError):
    """A dtype the family does not take (`--pred int8`): exit 2, as other usage errors."""


class BuildError(TunerError):
    """Rendering or compiling a variant failed; carries the variant and the compiler's message."""

    def __init__(self, variant_name: str, message: str):
        super().__init__(f"{variant_name}: {message}")
        self.variant_name = variant_name
        self.message = message


# A kernel's device-side validation flagged the inputs (num_boxes out of range, non-finite
# targets, ...): a ValueError defined by the op runtime, which needs torch alone.
from tuner.runtime import KernelInputError  # noqa: E402,F401
