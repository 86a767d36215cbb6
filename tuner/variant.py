"""A variant: one point of a kernel family's space, as a frozen, hashable value."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Iterator, Mapping


@dataclass(frozen=True)
class Variant:
    """Parameter values of one kernel variant, in the family's dimension order.

    `name` is stable and readable (the family, then each dimension's value in order, dot-separated);
    the content hash of what gets compiled (see `tuner.build`) names the files.

    A joined variant (`Variant.joined`) runs the forward of one point and the backward of another, where a
    family's forward and backward want different values of the parameters they share: its params
    are the forward's, then the backward's prefixed `backward:`, and its name reads `<forward>.bwd.<backward values>`.
    """

    family: str
    params: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, family: str, params: Mapping[str, Any]) -> "Variant":
        return cls(family, tuple(params.items()))

    @classmethod
    def joined(cls, forward: "Variant", backward: "Variant") -> "Variant":
        if forward.family != backward.family or forward.halves() or backward.halves():
            raise ValueError(f"a joined variant is two plain variants of one family: {forward.name}, {backward.name}")
        return cls(forward.family, forward.params + tuple((BACKWARD + k, v) for k, v in backward.params))

    def halves(self) -> tuple["Variant", "Variant"] | None:
        """(forward, backward) of a joined variant, else None."""
        back = tuple((k[len(BACKWARD):], v) for k, v in self.params if k.startswith(BACKWARD))
        if not back:
            return None
        return Variant(self.family, tuple((k, v) for k, v in self.params if not k.startswith(BACKWARD))), \
            Variant(self.family, back)

    def __getitem__(self, key: str) -> Any:
        for name, value in self.params:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.params)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def replace(self, **changes: Any) -> "Variant":
        params = self.as_dict()
        unknown = set(changes) - set(params)
        if unknown:
            raise KeyError(f"{self.family} variants have no parameter(s) {sorted(unknown)}")
        params.update(changes)
        return Variant.of(self.family, params)

    @functools.cached_property  # read thousands of times a search (queues, studies, tables by name)
    def name(self) -> str:
        halves = self.halves()
        if halves:
            return f"{halves[0].name}.bwd.{halves[1].name[len(self.family) + 1:]}"
        parts = [self.family]
        for key, value in self.params:
            if value is not False and value is not None:  # flags show only when set
                parts.append(_short(key, value))
        return ".".join(parts)

    def __str__(self) -> str:
        return self.name

    def to_json(self) -> str:
        return json.dumps({"family": self.family, "params": self.as_dict()}, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Variant":
        data = json.loads(text)
        return cls.of(data["family"], data["params"])


BACKWARD = "backward:"  # the prefix of a joined variant's backward parameters (no dimension name has a colon)

# Short forms that keep names readable; any other value prints as itself.
_PREFIX = {"boxes_per_thread": "k", "block_size": "b", "fault": "fault_", "split": "split"}


def _short(key: str, value: Any) -> str:
    if value is True:
        return key
    return f"{_PREFIX.get(key, '')}{value}"
