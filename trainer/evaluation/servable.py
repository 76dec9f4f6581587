"""Whether a cell can be served: the one rule every evaluation's table, JSON and quality line says it by.

A comparison of schedulers in a cell where every one of them loses its users is not a result: the rewards then
measure how long each holds out before the users leave, not how well it serves them (issue 64: on recorded 5G logs
scaled to a mean of the nominal capacity, every player but ``lowest`` lost every user). So an evaluation says, in
one word (:data:`UNSERVABLE`), where both the policy and the best baseline lose their users in most episodes.

An env's profile names the key of an episode's record that is 1 where the episode lost its users
(:attr:`envs.profiles.EnvProfile.abandonment`; VR-edge: ``abandoned``, a user past ``abandon_stall_s`` of
cumulative stall, which ends the episode); an env without one is never judged.

Example: the policy and the best baseline each lose their users in 9 of 10 episodes::

    >>> unservable({"abandoned": 0.9}, {"abandoned": 0.9}, "abandoned")
    True
    >>> unservable({"abandoned": 0.9}, {"abandoned": 0.2}, "abandoned")  # the best heuristic serves it
    False
    >>> print(unservable({"abandoned": 1.0}, None, "abandoned"))  # no baseline played: not said
    None
"""

from __future__ import annotations

from typing import Any

# A player "loses its users" in a cell when more than this fraction of its episodes end with a user abandoning:
# more often lost than kept, "most episodes" in the plain sense of the words. Both the policy and the best baseline
# must: a cell the best heuristic serves is servable, and a policy that loses users there simply plays badly.
LOST_IN_MOST_EPISODES = 0.5
UNSERVABLE = "UNSERVABLE"  # the one word tables, summaries and the quality line mark such a cell with


def unservable(policy: dict[str, Any], best_baseline: dict[str, Any] | None, key: str) -> bool | None:
    """Whether a cell cannot be served: the policy's and the best baseline's summaries
    (:func:`trainer.evaluation.statistics.summarize`) each lose their users (the mean of ``key``, the env's
    :attr:`~envs.profiles.EnvProfile.abandonment`) in more than :data:`LOST_IN_MOST_EPISODES` of their episodes.
    ``None`` where it cannot be said: no baseline was played, or the env has no such key."""
    if not key or best_baseline is None or key not in policy or key not in best_baseline:
        return None
    return bool(policy[key] > LOST_IN_MOST_EPISODES and best_baseline[key] > LOST_IN_MOST_EPISODES)


def unservable_text(policy: dict[str, Any], baseline: str, best_baseline: dict[str, Any], key: str) -> str:
    """What an evaluation says of an unservable cell, one line: the word, the two fractions, and what to do.

    >>> print(unservable_text({"abandoned": 1.0}, "fair_share", {"abandoned": 0.75}, "abandoned"))
    UNSERVABLE: the policy and the best baseline (fair_share) lose their users in most episodes (abandoned in 1.00 and 0.75 of them): nobody serves this cell, so the comparison here is no result; a trace set's scale sets how hard the cell is (docs/traces.md: trace_scale, trace_quantile)
    """  # noqa: E501
    return (f"{UNSERVABLE}: the policy and the best baseline ({baseline}) lose their users in most episodes "
            f"({key} in {policy[key]:.2f} and {best_baseline[key]:.2f} of them): nobody serves this cell, so the "
            "comparison here is no result; a trace set's scale sets how hard the cell is (docs/traces.md: "
            "trace_scale, trace_quantile)")
