"""{{name}}: a spechost drafter, in Python.

It proposes what followed the last time the context's final `ngram` tokens appeared earlier in
the context (prompt lookup): edits, summaries and extractions repeat their prompt, so the target
often accepts several tokens per round. Replace `propose` with your own idea.

The host opens one `Session` per request, one at a time per plugin instance. State that must
outlive requests belongs at module level: the module lives as long as the host keeps the plugin
loaded (it starts again from scratch if the plugin traps). componentize-py 0.25 never frees a
finished session (its resource destructor does nothing), so `open` empties the previous one:
otherwise every request's context would stay in memory until the plugin reaches its memory cap.

Config (`--plugin-config {{name}}.ngram=2`):

    ngram   3   tokens matched at the end of the context before looking back for them
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import app as drafter_api
from wit_world.imports.types import Feedback, ModelFacts, Proposal

DEFAULT_NGRAM = 3


def parse_config(config: str) -> int:
    """`ngram` from `key=value,...`; raises `Err` naming a bad setting and the fix."""
    ngram = None
    for item in filter(None, (part.strip() for part in config.split(","))):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals:
            raise Err(f"setting `{item}` has no `=`; write settings as `key=value` pairs separated by `,`")
        if key != "ngram":
            raise Err(f"unknown setting `{key}` (value `{value}`); the known setting is `ngram`")
        if ngram is not None:
            raise Err("setting `ngram` is given twice; keep only one")
        if not value.isdigit() or int(value) < 1:
            raise Err(f"setting `ngram` has value `{value}`, expected a whole number of at least 1, e.g. `3`")
        ngram = int(value)
    return DEFAULT_NGRAM if ngram is None else ngram


# The session opened last (see the module's docstring).
PREVIOUS: "Session | None" = None


class App(exports.App):
    """The exported interface's plain functions."""

    def checkpoint(self) -> None:
        """Nothing to save: this drafter keeps nothing across requests."""

    def observe_response(self, response: list[int]) -> None:
        """Another request's finished response: nothing to learn, this drafter keeps nothing
        across requests."""


class Session(drafter_api.Session):
    """One request's drafter."""

    def __init__(self, ngram: int, facts: ModelFacts) -> None:
        self.ngram = ngram
        self.end_of_generation = set(facts.eog)
        self.context: list[int] = []

    @classmethod
    def open(cls, config: str, facts: ModelFacts) -> "Session":
        global PREVIOUS
        session = cls(parse_config(config), facts)
        if PREVIOUS is not None:
            PREVIOUS.context = []
        PREVIOUS = session
        return session

    def feed(self, tokens: list[int]) -> None:
        self.context.extend(tokens)

    def propose(self, max_draft_len: int) -> Proposal:
        context, n = self.context, self.ngram
        start = len(context) - n
        if start < 0:
            return Proposal([], [])
        tail = context[start:]
        # The latest earlier occurrence of the tail, and what followed it.
        for i in range(start - 1, -1, -1):
            if context[i : i + n] == tail:
                tokens: list[int] = []
                for token in context[i + n : i + n + max_draft_len]:
                    tokens.append(token)
                    if token in self.end_of_generation:
                        break
                return Proposal(tokens, [])
        return Proposal([], [])

    def feedback(self, outcome: Feedback) -> None:
        """How the last proposal fared; this drafter does not use it."""
