"""Where each uniform of a VR-edge block goes: the layout of the draws one env takes per step (and per reset).

Every step (and every reset) an env draws one block of uniforms, ``[B, size]``, at its counter
(:func:`envs.rng.uniform_block`). The NumPy dynamics, the torch port, the belief filter and the belief MPC read the
same block: naming each draw here keeps them on the same index (a draw that moved in one of them would change the
env's trajectories in the others without an error).

The cell's five come first, at fixed indices (:class:`Draw`); then each user's channel (two per user: a normal by
Box-Muller); where the cell's users vary, the reset's user count and one draw per slot for leaving or joining
(:class:`DrawLayout`); where the cell has outages (``outage_prob``), one for the outage chain; where ``capacity_scale``
is a range, one for the episode's scale (a reset's only), last. Some draws serve a
second purpose at reset, where the step's purpose is idle (a recorded trace's file and start window): a recorded trace
replaces the synthetic cell without shifting any other draw.

Example:
    >>> layout = DrawLayout.of(num_users=3, varies=True)
    >>> Draw.FADE, layout.channel, layout.channel_pair, layout.users, layout.churn, layout.size
    (4, slice(5, 8, None), slice(8, 11, None), 11, slice(12, 15, None), 15)
    >>> DrawLayout.of(num_users=3, varies=False).size   # a fixed cell draws no users and no churn
    11
    >>> with_outages = DrawLayout.of(num_users=3, varies=False, outages=True)  # one more, after all the others
    >>> with_outages.outage, with_outages.size
    (11, 12)
    >>> DrawLayout.of(num_users=3, varies=False, outages=True, scale_varies=True).scale   # one more, last
    12
"""

from __future__ import annotations

from dataclasses import dataclass


class Draw:
    """The cell's draws, the same index in every block (plain ints: they index NumPy arrays and torch tensors
    alike, under ``torch.compile`` too)."""

    REGIME = 0  # step: whether the regime leaves; reset: which regime it starts in
    NEXT_REGIME = 1  # step: which of the two others it goes to; reset: a cell trace's file
    NOISE = 2  # with NOISE_PAIR, one normal (Box-Muller): the capacity noise's innovation (reset: its start)
    NOISE_PAIR = 3
    FADE = 4  # step: whether a deep fade starts or ends; reset: a cell trace's start window


CELL_DRAWS = 5  # the draws of :class:`Draw`; the users' follow them


@dataclass(frozen=True)
class DrawLayout:
    """The users' part of a block of ``num_users`` slots: ``channel`` and ``channel_pair`` (``[U]`` each: one
    normal per user, which a user trace's file and start window use instead), then where the cell varies ``users``
    (the reset's user count), ``episode_churn`` (the reset's churn, where it is a range) and ``churn`` (``[U]``,
    each slot's leave or join per step; a reset's churn is its first draw, which a reset leaves free), then where
    the cell has outages ``outage`` (whether the outage chain moves, per step; a reset's draws the episode's
    ``outage_prob`` where that is a range: every episode starts out of an outage), then where ``capacity_scale`` is a
    range ``scale`` (the reset's scale; a step leaves it idle). Each after every other draw, so that a cell without
    them draws as before."""

    channel: slice
    channel_pair: slice
    users: int
    episode_churn: int
    churn: slice
    outage: int
    scale: int
    size: int

    @classmethod
    def of(cls, num_users: int, varies: bool, outages: bool = False, scale_varies: bool = False) -> DrawLayout:
        """The layout for a cell of ``num_users`` slots; ``varies``: whether its active users vary (only then does
        it draw users and churn); ``outages``: whether it has the outage chain (only then does it draw for it);
        ``scale_varies``: whether its capacity scale is drawn per episode (only then does it draw one)."""
        users = CELL_DRAWS + 2 * num_users
        before = users + (1 + num_users if varies else 0)
        scale = before + (1 if outages else 0)
        return cls(channel=slice(CELL_DRAWS, CELL_DRAWS + num_users), channel_pair=slice(CELL_DRAWS + num_users, users),
                   users=users, episode_churn=users + 1, churn=slice(users + 1, users + 1 + num_users),
                   outage=before, scale=scale, size=scale + (1 if scale_varies else 0))
