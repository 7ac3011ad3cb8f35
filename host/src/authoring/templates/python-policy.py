"""{{name}}: a spechost draft-length policy, in Python.

Additive increase, multiplicative decrease: the draft grows by one token after a round whose
draft was accepted whole and halves after a rejection, within the host's `max-draft-len`.
Replace `observe` and `decide` with your own idea.

Config (`--policy {{name}}.wasm,start=2`):

    start   4   the draft length of a request's first round
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import app as policy_api
from wit_world.exports.app import Decision, PolicySetup, RoundRecord
from wit_world.imports.types import ModelFacts

DEFAULT_START = 4


def parse_config(config: str) -> int:
    """`start` from `key=value,...`; raises `Err` naming a bad setting and the fix."""
    start = None
    for item in filter(None, (part.strip() for part in config.split(","))):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals:
            raise Err(f"setting `{item}` has no `=`; write settings as `key=value` pairs separated by `,`")
        if key != "start":
            raise Err(f"unknown setting `{key}` (value `{value}`); the known setting is `start`")
        if start is not None:
            raise Err("setting `start` is given twice; keep only one")
        if not value.isdigit():
            raise Err(f"setting `start` has value `{value}`, expected a whole number, e.g. `4`")
        start = int(value)
    return DEFAULT_START if start is None else start


class App(exports.App):
    """The exported interface has no plain functions."""


class PolicySession(policy_api.PolicySession):
    """One request's policy."""

    def __init__(self, start: int, setup: PolicySetup) -> None:
        self.max = setup.max_draft_len
        self.len = min(max(start, 1), max(self.max, 1))

    @classmethod
    def open(cls, config: str, facts: ModelFacts, setup: PolicySetup) -> "PolicySession":
        return cls(parse_config(config), setup)

    def wants_text(self) -> bool:
        return False

    def observe(self, round: RoundRecord) -> None:
        drafted = max(round.n_verified - 1, 0)
        if drafted == 0:
            return
        if round.n_accepted == drafted:
            self.len = min(self.len + 1, self.max)
        else:
            self.len = max(self.len // 2, 1)

    def decide(self) -> Decision:
        return Decision(min(self.len, self.max), 0, None, [])
