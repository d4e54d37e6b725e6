"""The output feed: a trainer's raw console bytes in, lines and what they say out.

One pipeline for the live agent and for `trainctl scan`: split on \\r and \\n (ANSI
stripped), parse each line for progress and phases, and match it against the warning
signatures.  Pure: time is an argument; nothing here blocks or touches a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainctl.core import events as E
from trainctl.core.lines import LineSplitter
from trainctl.core.parse import ConsoleParser
from trainctl.core.user_pattern import compile_user_pattern

if TYPE_CHECKING:
    from trainctl.core.signatures import WarningMatcher


@dataclass(frozen=True)
class FedLine:
    text: str
    events: tuple[E.Event, ...]  # progress and phase events parsed from the line
    warning: E.Warning | None = None  # the signature it matched (repeats counted by the matcher)
    evidence: bool = False  # the line shows the trainer busy starting up


class OutputFeed:
    def __init__(
        self,
        matcher: WarningMatcher | None = None,
        source: str = "trainer",
        progress: dict[str, Any] | None = None,
    ) -> None:
        """``matcher``: a :class:`~trainctl.core.signatures.WarningMatcher` (or None:
        no warnings).  ``source`` is passed to it ('trainer' or 'kernel').  ``progress``: a
        job's ``[progress]`` table (``{"pattern", "losses"}``, validated with the job), tried
        before the built-in formats."""
        self.matcher = matcher
        self.source = source
        self.splitter = LineSplitter()
        user = compile_user_pattern(progress["pattern"], progress.get("losses", ())) if progress else None
        self.parser = ConsoleParser(user)

    @property
    def phase(self) -> str | None:
        """The last phase the console showed (for a postmortem)."""
        return self.parser.phase

    def feed(self, data: bytes, now: float) -> list[FedLine]:
        return [self.line(text, now) for text in self.splitter.feed(data)]

    def flush(self, now: float) -> list[FedLine]:
        """What is left in the splitter once the stream has ended (a last line with no newline)."""
        return [self.line(text, now) for text in self.splitter.flush()]

    def line(self, text: str, now: float) -> FedLine:
        warning, evidence = None, False
        if self.matcher is not None:
            warning = self.matcher.feed(text, now, self.source)
            last = getattr(self.matcher, "last", None)  # scan's matchers may not say
            evidence = last is not None and last.startup_evidence
        return FedLine(text, tuple(self.parser.feed(text, now)), warning, evidence)
