"""python_drafter: an n-gram drafter for spechost, written in Python.

It counts, over everything it is fed (the prompts and outputs of every request since the
plugin was loaded), which token followed each token (2-grams) and each pair of tokens
(3-grams). To propose, it looks up the last two tokens of the context, or the last one when
that pair was never seen, and takes the token that most often came next; then it does the
same from the context extended with that token, and so on. It stops when the next token is
too uncertain, that is when

    count(that next token after the context) / count(the context)

drops below `min_prob`, after an end-of-generation token, or at the host's `max_draft_len`.
The confidence of each proposed token is the product of the ratios up to it.

Where state lives: the host opens one `Session` per request and drops it when the request
ends. The n-gram counts must outlive requests, so they live at module level, in `TABLE`: the
plugin instance (this module, already imported) lives as long as the host keeps the plugin
loaded, and starts again from an empty table if it traps and is re-created. In a server, the
table also learns from the responses of requests other instances served, which the host hands
to `App.observe_response` between requests.

Config (`--plugin-config python_drafter.min_prob=0.6,python_drafter.max_ngrams=20000`):

    min_prob    0.5     stop at a step whose ratio is below this, from 0 to 1
    max_ngrams  65536   n-grams (a context and a token that followed it) the table keeps,
                        from 1 to 262144; once full, no new ones are learnt, while the counts
                        of those it has still grow

Build it with `build.sh` beside this file; see README.md.
"""

import gc
import time

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import app as drafter_api
from wit_world.imports import host
from wit_world.imports.types import Feedback, ModelFacts, Proposal

DEFAULT_MIN_PROB = 0.5
DEFAULT_MAX_NGRAMS = 65_536
# An n-gram costs at most about 200 bytes of Python objects (when it is its context's only
# one): a full table of 262 144 of them took the plugin's memory from 13 MiB to 64 MiB, well
# under the 256 MiB the host allows.
MAX_MAX_NGRAMS = 262_144
# Most distinct next tokens kept per context; rarer ones still count toward its total.
MAX_FOLLOWERS = 16
# The host interrupts any call that runs for 50 ms. Learning a long prompt token by token can
# take longer than that in Python, so one `feed` learns for at most this long and leaves the
# rest of its tokens to the next calls (the table then lags a little behind the context).
LEARN_BUDGET_S = 0.015
# Tokens learnt between two looks at the clock.
LEARN_CHUNK = 64
# A session logs a summary of its acceptance once per this many rounds (at debug level).
SUMMARY_EVERY_ROUNDS = 100

SYNTAX_HINT = "write settings as `key=value` pairs separated by `,`, e.g. `min_prob=0.6`"


class Followers:
    """What followed one context: a total, the most frequent next token, and per-token counts."""

    __slots__ = ("total", "best", "best_count", "counts")

    def __init__(self) -> None:
        self.total = 0
        self.best = 0
        self.best_count = 0
        self.counts: dict[int, int] = {}


class NgramTable:
    """Next-token counts per context, where a context is a tuple of one or two tokens.

    An n-gram is a context and one token that followed it; the table keeps at most
    `max_ngrams` of them, which bounds its memory (each costs at most about 200 bytes)."""

    def __init__(self) -> None:
        self.contexts: dict[tuple[int, ...], Followers] = {}
        self.ngrams = 0

    def learn(self, context: tuple[int, ...], next_token: int, max_ngrams: int) -> None:
        """Records that `context` was followed by `next_token`."""
        followers = self.contexts.get(context)
        if followers is None:
            if self.ngrams >= max_ngrams:
                return
            followers = self.contexts[context] = Followers()
        followers.total += 1
        count = followers.counts.get(next_token, 0) + 1
        if count == 1:
            # A new n-gram: kept only while there is room, in the table and for this context.
            if self.ngrams >= max_ngrams or len(followers.counts) >= MAX_FOLLOWERS:
                return
            self.ngrams += 1
        followers.counts[next_token] = count
        # Counts only grow, so only the count just raised can overtake the best one.
        if count > followers.best_count:
            followers.best, followers.best_count = next_token, count

    def most_likely_next(self, first: int | None, last: int) -> tuple[int, float] | None:
        """The most frequent next token after (`first`, `last`), or after `last` alone when
        that pair is unknown (or `first` is None), with its ratio; None if neither is known."""
        followers = None
        if first is not None:
            followers = self.contexts.get((first, last))
        if followers is None:
            followers = self.contexts.get((last,))
        if followers is None:
            return None
        return followers.best, followers.best_count / followers.total


# Learnt from every request since the plugin was loaded.
TABLE = NgramTable()

# `max_ngrams` of the latest session opened: an observed response comes with no config, so it
# is learnt under this one (the default until a session opens).
observed_max_ngrams = DEFAULT_MAX_NGRAMS

# CPython's cycle collector now and then walks every object the table holds: with a full table,
# a pause longer than the host's 50 ms deadline (the call that happens to trigger it traps).
# Nothing here makes reference cycles, so reference counting alone frees all garbage.
gc.disable()


def learn_tokens(tokens: list[int], learnt: int, max_ngrams: int, deadline: float) -> int:
    """Learns what followed each token and pair of tokens in `tokens`, from index `learnt` on,
    oldest first, until `deadline`; returns the index of the first token not learnt yet."""
    while learnt < len(tokens) and time.monotonic() < deadline:
        end = min(learnt + LEARN_CHUNK, len(tokens))
        for i in range(max(learnt, 1), end):
            TABLE.learn((tokens[i - 1],), tokens[i], max_ngrams)
            if i >= 2:
                TABLE.learn((tokens[i - 2], tokens[i - 1]), tokens[i], max_ngrams)
        learnt = end
    return learnt


def parse_config(config: str) -> tuple[float, int]:
    """`min_prob` and `max_ngrams` from `key=value,...`; raises `Err` with a message that names
    the setting and how to fix it."""
    settings: dict[str, str] = {}
    for item in config.split(","):
        item = item.strip()
        if not item:
            continue
        key, equals, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not equals:
            raise Err(f"setting `{item}` has no `=`; {SYNTAX_HINT}")
        if not key:
            raise Err(f"setting `{item}` has no key before `=`; {SYNTAX_HINT}")
        if key in settings:
            raise Err(
                f"setting `{key}` is given twice (`{settings[key]}` and `{value}`); keep only one"
            )
        settings[key] = value

    min_prob = DEFAULT_MIN_PROB
    max_ngrams = DEFAULT_MAX_NGRAMS
    for key, value in settings.items():
        if key == "min_prob":
            try:
                min_prob = float(value)
            except ValueError:
                min_prob = -1.0
            if not 0.0 <= min_prob <= 1.0:  # also false for NaN
                raise Err(
                    f"setting `min_prob` has value `{value}`, expected a number from 0 to 1, "
                    "e.g. `0.5`"
                )
        elif key == "max_ngrams":
            try:
                max_ngrams = int(value)
            except ValueError:
                max_ngrams = 0
            if not 1 <= max_ngrams <= MAX_MAX_NGRAMS:
                raise Err(
                    f"setting `max_ngrams` has value `{value}`, expected a whole number from 1 to "
                    f"{MAX_MAX_NGRAMS}, e.g. `{DEFAULT_MAX_NGRAMS}`"
                )
        else:
            raise Err(
                f"unknown setting `{key}` (value `{value}`); known settings are `min_prob`, "
                "`max_ngrams`"
            )
    return min_prob, max_ngrams


class App(exports.App):
    """The interface's plain functions (`--export-interface-name` in build.sh names it `app`)."""

    def checkpoint(self) -> None:
        # The table is not persisted across runs (this world imports no `state`).
        pass

    def observe_response(self, response: list[int]) -> None:
        # Learnt like a session's context, for at most one call's budget: the rest of a very
        # long response (thousands of tokens) is left out.
        learn_tokens(response, 0, observed_max_ngrams, time.monotonic() + LEARN_BUDGET_S)


class Session(drafter_api.Session):
    """One request: the end of its context, and its own acceptance.

    A session keeps only what it still needs: the tokens not learnt yet and the two before
    them. Besides being enough, that keeps a session small after the request, which matters
    because componentize-py 0.25 never frees an exported resource (its destructor hook does
    nothing), so every session object this plugin returns stays in memory for good."""

    def __init__(self, min_prob: float, max_ngrams: int, facts: ModelFacts) -> None:
        self.min_prob = min_prob
        self.max_ngrams = max_ngrams
        self.vocab_size = facts.vocab_size
        self.end_of_generation = set(facts.eog)
        if facts.eos is not None:
            self.end_of_generation.add(facts.eos)
        # The end of the context: tokens not learnt yet, after the (up to) two before them.
        self.context: list[int] = []
        # Index in `context` of the first token not learnt yet.
        self.learnt = 0
        self.last_proposal_len = 0
        self.rounds = self.wins = self.verified = self.accepted = 0

    @classmethod
    def open(cls, config: str, facts: ModelFacts) -> "Session":
        global observed_max_ngrams
        min_prob, max_ngrams = parse_config(config)
        observed_max_ngrams = max_ngrams
        return cls(min_prob, max_ngrams, facts)

    def feed(self, tokens: list[int]) -> None:
        self.context.extend(tokens)
        self.learn(time.monotonic() + LEARN_BUDGET_S)

    def learn(self, deadline: float) -> None:
        """Learns the tokens not learnt yet, oldest first, until `deadline`; then forgets the
        tokens that no longer are the context of one not learnt yet."""
        learnt = learn_tokens(self.context, self.learnt, self.max_ngrams, deadline)
        forget = max(learnt - 2, 0)
        del self.context[:forget]
        self.learnt = learnt - forget

    def propose(self, max_draft_len: int) -> Proposal:
        tokens: list[int] = []
        confidence: list[float] = []
        first = self.context[-2] if len(self.context) >= 2 else None
        last = self.context[-1] if self.context else None
        probability = 1.0
        while last is not None and len(tokens) < max_draft_len:
            found = TABLE.most_likely_next(first, last)
            if found is None:
                break
            next_token, ratio = found
            if ratio < self.min_prob or next_token >= self.vocab_size:
                break
            probability *= ratio
            tokens.append(next_token)
            confidence.append(probability)
            if next_token in self.end_of_generation:
                break
            first, last = last, next_token
        self.last_proposal_len = len(tokens)
        return Proposal(tokens, confidence)

    def feedback(self, outcome: Feedback) -> None:
        self.rounds += 1
        if outcome.won:
            self.wins += 1
            self.verified += self.last_proposal_len
            self.accepted += outcome.n_accepted
        if self.rounds % SUMMARY_EVERY_ROUNDS == 0:
            host.log(host.Level.DEBUG, self.summary())

    def summary(self) -> str:
        acceptance = 100.0 * self.accepted / self.verified if self.verified else 0.0
        return (
            f"python_drafter: {self.rounds} rounds proposed, {self.wins} won, "
            f"{self.accepted}/{self.verified} verified tokens accepted ({acceptance:.1f}%), "
            f"{TABLE.ngrams} n-grams known"
        )
