"""The MoE layer kernel's ticket/counter protocol (tactics/cuda/moe_layer_protocol.py) on the CPU: random
CTA start orders, residency limits from 1 CTA to a whole H100 (132 SMs x 2), launches replayed with the
routes changed between them, -1 and bad ids, and the epoch's wrap. Every launch must finish (no CTA
spins on a state no running CTA can change), read only h rows written in its own launch, write every
valid token's rows, leave the ticket and done words at 0 and advance the epoch by one (clearing the
counters at the wrap). The bug the ticket prevents (roles by blockIdx) is shown to deadlock at
residency 1 and to end, with a bounded spin, in the recorded error word and its message."""
import random

import pytest

from autotune.tactics.cuda import moe_layer_protocol as P


def _routes(rng, m, top_k, n_exp, bad=False):
    """ids [m * top_k]: routed slots (distinct experts per token, some -1), the last slot the shared expert."""
    ids = []
    for _ in range(m):
        row = rng.sample(range(n_exp - 1), top_k - 1)
        row = [-1 if rng.random() < 0.1 else e for e in row]
        ids += row + [n_exp - 1]
    if bad:
        ids[rng.randrange(len(ids))] = rng.choice([n_exp, 10 ** 6, -2])
    return tuple(ids)


def _check_launch(st, ln, tr, ep0):
    assert not tr.violations, tr.violations[:3]
    assert st.err == 0, P.describe(st.err)
    assert st.tick == 0 and st.done == 0
    assert st.epoch == P.next_epoch(ep0)[0]
    for tok in range(ln.m):
        slots = ln.ids[tok * ln.top_k:(tok + 1) * ln.top_k]
        if all(-1 <= e < st.n_exp for e in slots):
            assert {(tok, nt) for nt in range(ln.n2_tiles)} <= tr.y_done, f"token {tok}'s rows not written"


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_progress_and_epochs_under_any_start_order_and_residency(m):
    rng = random.Random(1000 + m)
    top_k, n_exp = 9, 33                              # GLM-5: 8 routed + the shared slot; a small expert set
    n13_tiles, n2_tiles = 2, 3
    st, tr = P.State(n_exp), P.Trace()
    grid = P.Launch(_routes(rng, m, top_k, n_exp), top_k, n13_tiles, n2_tiles).grid
    residencies = sorted({1, 2, 3, 7, 32, grid // 2 or 1, grid, 264})
    launch = 0
    for res in residencies:
        for _ in range(4):                            # replays, the route changed between them
            ln = P.Launch(_routes(rng, m, top_k, n_exp), top_k, n13_tiles, n2_tiles)
            ep0 = st.epoch
            P.run_launch(st, ln, res, rng, tr, launch)
            _check_launch(st, ln, tr, ep0)
            launch += 1
    assert tr.reads_ok > 0


def test_many_tokens_on_one_expert_need_every_group():
    """256 pairs, all on one expert: 32 groups x the w13 tiles arrive on one counter before any w2 CTA reads."""
    rng = random.Random(7)
    st, tr = P.State(4), P.Trace()
    ln = P.Launch(tuple([2] * 256), 8, 4, 2)
    for launch, res in enumerate((1, 5, 300)):
        ep0 = st.epoch
        P.run_launch(st, ln, res, rng, tr, launch)
        _check_launch(st, ln, tr, ep0)
    assert P.groups(ln.ids, 4) == {2: 32}


def test_bad_and_absent_ids():
    rng = random.Random(3)
    st, tr = P.State(17), P.Trace()
    for launch in range(20):
        ln = P.Launch(_routes(rng, 4, 5, 17, bad=launch % 2 == 0), 5, 2, 2)
        ep0 = st.epoch
        P.run_launch(st, ln, rng.choice([1, 2, 6, 64]), rng, tr, launch)
        _check_launch(st, ln, tr, ep0)
    # a token with every slot -1 reads nothing and still writes its (zero) rows
    ln = P.Launch(tuple([-1] * 5 + [3, 4, 5, 6, 16]), 5, 1, 1)
    ep0 = st.epoch
    P.run_launch(st, ln, 1, rng, tr, 99)
    _check_launch(st, ln, tr, ep0)


def test_epoch_wrap_clears_the_counters():
    """Across the wrap (EPOCH_MAX -> 1) a counter last written at epoch 1 must not count toward epoch 1
    again: the last CTA of the wrapping launch clears them. Without the clear the model reads stale h."""
    rng = random.Random(11)
    n_exp = 9
    ids_a = tuple([0] * 8 + [1] * 8)                  # expert 0: 1 group; expert 1: 1 group
    ln = P.Launch(ids_a, 8, 2, 1)
    st, tr = P.State(n_exp), P.Trace()
    st.epoch = 1
    P.run_launch(st, ln, 3, rng, tr, 0)              # expert 0's word: epoch 1, 2 arrivals
    assert st.cnt[0] == (1 << P.EPOCH_BITS) | 2
    st.epoch = P.EPOCH_MAX - 1                         # as if 2^16 - 3 launches went by without expert 0
    ln_b = P.Launch(tuple([1] * 16), 8, 2, 1)
    for launch in (1, 2):
        ep0 = st.epoch
        P.run_launch(st, ln_b, 4, rng, tr, launch)
        _check_launch(st, ln_b, tr, ep0)
    assert st.epoch == 1 and st.cnt == [0] * n_exp     # wrapped, counters cleared
    ep0 = st.epoch
    P.run_launch(st, ln, 1, rng, tr, 3)              # expert 0 again at epoch 1: needs fresh arrivals
    _check_launch(st, ln, tr, ep0)


def test_the_wrap_without_the_clear_is_caught(monkeypatch):
    """The model's checks can fail: with the wrap's clear left out, a w2 CTA passes its acquire on a
    word last written EPOCH_MAX launches ago and reads h rows of that launch, or the fresh arrivals
    overshoot the word another w2 CTA waits for (the exact match the acquire requires) and it spins."""
    monkeypatch.setattr(P, "next_epoch", lambda ep: (ep + 1, False) if ep < P.EPOCH_MAX else (1, False))
    ln = P.Launch(tuple([0] * 8 + [1] * 8), 8, 1, 1)
    caught = 0
    for seed in range(10):
        rng = random.Random(seed)
        st, tr = P.State(4), P.Trace()
        st.epoch = 1
        P.run_launch(st, ln, 2, rng, tr, 0)
        st.epoch = P.EPOCH_MAX
        P.run_launch(st, P.Launch(tuple([1] * 16), 8, 1, 1), 2, rng, tr, 1)
        assert st.epoch == 1 and st.cnt[0] == (1 << P.EPOCH_BITS) | 1   # stale, and it looks current
        try:
            P.run_launch(st, ln, ln.grid, rng, tr, 2)
        except P.Deadlock:
            caught += 1
            continue
        caught += bool(tr.violations)
    assert caught


def test_roles_by_block_index_deadlock_at_residency_one():
    """Without the ticket (role = blockIdx) a w2 CTA that starts first spins on h no running CTA writes:
    the model finds the deadlock, and with the kernel's bounded spin the launch ends with ERR_SPIN."""
    ln = P.Launch(tuple([0] * 4 + [1] * 4), 4, 2, 1)
    found = False
    for seed in range(20):
        st, tr = P.State(2), P.Trace()
        try:
            P.run_launch(st, ln, 1, random.Random(seed), tr, 0, by_ticket=False)
        except P.Deadlock as e:
            found = True
            assert "resident CTAs spin" in str(e)
            st, tr = P.State(2), P.Trace()
            P.run_launch(st, ln, 1, random.Random(seed), tr, 0, by_ticket=False, spin_bound=50)
            assert st.err == P.ERR_SPIN and "waited past its bound" in P.describe(st.err)
            assert st.tick == 0 and st.done == 0        # the launch still ended and reset its words
            break
    assert found


def test_scope_refusals():
    P.check_scope(16, 9, 16, 257)
    with pytest.raises(ValueError, match="pairs > 256"):
        P.check_scope(32, 9, 16, 257)
    with pytest.raises(ValueError, match="arrivals"):
        P.check_scope(16, 16, 5000, 257)
    assert P.next_epoch(P.EPOCH_MAX) == (1, True) and P.next_epoch(0) == (1, False)
