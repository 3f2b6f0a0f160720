"""The replay of greedy speculation's KV side: equal to the model-run reference loop, a golden trace
checked by hand, invariants over random sequences, and every refusal."""

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.errors import BlockError, ConfigError, PromptError
from paged_kv.spec_decode import NgramProposer, SlotState
from paged_kv.spec_decode import replay_speculation as replay_default

# These cases draft at the first pass too (the no-cache loop's way), so that one pass shows every
# phase from an empty table; the default (no drafts with the prefill) is checked on its own.
replay_speculation = functools.partial(replay_default, draft_at_prefill=True)


class Fixed:
    """Proposes the given drafts in turn (cut to the limit)."""

    def __init__(self, *drafts):
        self.drafts = list(drafts)

    def propose(self, tokens, limit):
        return list(self.drafts.pop(0))[:limit] if self.drafts else []


# --- the model-run reference ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_greedy():
    from paged_kv.decoding import speculative_greedy
    from paged_kv.model.checkpoint import load_tiny_model
    model, tok = load_tiny_model()
    prompt = tok.encode("ROMEO:\n")
    plain = speculative_greedy(model, prompt, 60, NgramProposer(1, 200))   # never matches: plain greedy
    return model, prompt, plain.token_ids[len(prompt):], speculative_greedy


@pytest.mark.parametrize("k, lo, hi", [(2, 1, 2), (6, 3, 3)])
def test_replay_equals_speculative_greedy_on_the_tiny_model(tiny_greedy, k, lo, hi):
    model, prompt, target, speculative_greedy = tiny_greedy
    ref = speculative_greedy(model, prompt, len(target), NgramProposer(k, lo, hi))
    trace = replay_speculation(prompt, target, NgramProposer(k, lo, hi), block_size=4, num_blocks=64)
    assert list(trace.prompt_ids) + list(trace.output_ids) == ref.token_ids
    assert (trace.passes, trace.drafted, trace.accepted, trace.rolled_back) == (
        ref.target_passes, ref.draft_tokens, ref.accepted_tokens, ref.rolled_back)
    assert trace.passes < len(target)          # prompt lookup saves passes on this text


# --- a golden trace, checked by hand --------------------------------------------------------------
def test_golden_trace_a_draft_across_a_block_boundary():
    # block size 4, a 6-token prompt, free queue 3, 1, 0, 2.  Step 0 feeds the 6 prompt tokens and a
    # 3-token draft: positions 0-8 need 3 blocks, 3 1 0 (position 8 crosses into block 0).  The
    # target's continuation is 20 21 ...: draft 20 99 98 keeps 20 (1 accepted), then the target's 21.
    # Kept: 6 prompt + 1 accepted = 7 slots with K/V, blocks 3 1; positions 7 (block 1 offset 3,
    # slot 7) and 8 (block 0 offset 0, slot 0) are rolled back; block 0 goes to the tail of the
    # free queue (FIFO, no prefix cache): 2, 0.
    trace = replay_speculation([10, 11, 12, 13, 14, 15], [20, 21, 22, 23], Fixed([20, 99, 98]), block_size=4,
                               num_blocks=4, free_order=[3, 1, 0, 2], max_steps=1)
    (s,) = trace.steps
    assert s.drafted == (20, 99, 98) and s.accepted == 1 and s.emitted == (20, 21)
    assert s.table_before == () and s.table_verify == (3, 1, 0) and s.table_after == (3, 1)
    assert s.new_blocks == (3, 1, 0)
    assert s.written_slots == (12, 13, 14, 15, 4, 5, 6, 7, 0)
    assert s.discarded_slots == (7, 0)
    assert s.freed_blocks == (0,) and s.free_queue == (2, 0) and s.freed_positions == (1,)
    assert s.passes == 1 and s.num_kept == 7
    V, A, R, F = SlotState.VERIFIED, SlotState.ACCEPTED, SlotState.REJECTED, SlotState.FREE
    assert s.slot_states("propose") == ()
    assert s.slot_states("verify") == ((V,) * 4, (V, V, SlotState.DRAFT, SlotState.DRAFT), (SlotState.DRAFT, F, F, F))
    assert s.slot_states("accept") == ((V,) * 4, (V, V, A, R), (R, F, F, F))
    assert s.slot_states("rollback") == ((V,) * 4, (V, V, A, F))
    assert trace.output_ids == (20, 21)


def test_a_second_step_appends_from_the_last_emitted_token():
    # after step 0 (7 slots held, 8 tokens), step 1 feeds token 21 at position 7 and drafts 22 23:
    # positions 7-9; the target agrees with both, so nothing is rolled back and 3 tokens come out.
    trace = replay_speculation([10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24], Fixed([20, 99, 98], [22, 23]),
                               block_size=4, num_blocks=4, free_order=[3, 1, 0, 2])
    s = trace.steps[1]
    assert (s.num_computed, s.num_fed, s.accepted, s.emitted) == (7, 1, 2, (22, 23, 24))
    assert s.table_before == (3, 1) and s.table_verify == (3, 1, 2) and s.new_blocks == (2,)
    assert s.written_slots == (7, 8, 9) and s.discarded_slots == () and s.freed_blocks == ()
    assert trace.output_ids == (20, 21, 22, 23, 24) and trace.passes == 2
    assert (trace.drafted, trace.accepted, trace.rolled_back) == (5, 3, 2)
    assert trace.acceptance_rate == 3 / 5 and trace.tokens_per_pass == 5 / 2


# --- invariants over random sequences -------------------------------------------------------------
def plain_loop(prompt, target, proposer):
    """The accept loop with no blocks at all: passes, drafted, accepted."""
    seq, out, passes, drafted, accepted = list(prompt), [], 0, 0, 0
    while len(out) < len(target):
        draft = proposer.propose(seq, limit=len(target) - len(out) - 1)
        a = 0
        while a < len(draft) and draft[a] == target[len(out) + a]:
            a += 1
        kept = list(draft[:a]) + [target[len(out) + a]]
        seq, out = seq + kept, out + kept
        passes, drafted, accepted = passes + 1, drafted + len(draft), accepted + a
    return passes, drafted, accepted


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=10), st.lists(st.integers(0, 2), min_size=1, max_size=25),
       st.integers(1, 5), st.integers(1, 3), st.integers(1, 5))
def test_invariants_against_a_loop_without_blocks(prompt, target, k, n, bs):
    need = -(-(len(prompt) + len(target) - 1) // bs)
    trace = replay_speculation(prompt, target, NgramProposer(k, n), block_size=bs, num_blocks=need)
    assert trace.output_ids == tuple(target)
    assert (trace.passes, trace.drafted, trace.accepted) == plain_loop(prompt, target, NgramProposer(k, n))
    assert trace.rolled_back == trace.drafted - trace.accepted
    computed = done = 0
    for s in trace.steps:
        a, d = s.accepted, len(s.drafted)
        assert s.drafted[:a] == tuple(target[done:done + a]) and (a == d or s.drafted[a] != target[done + a])
        assert s.emitted == tuple(target[done:done + a + 1])
        done += len(s.emitted)
        assert s.num_computed == computed and s.num_fed == (len(prompt) if s.index == 0 else 1)
        held = s.num_computed + s.num_fed + d
        assert len(s.table_verify) == -(-held // bs) and len(s.table_after) == -(-s.num_kept // bs)
        assert s.table_verify[:len(s.table_before)] == s.table_before            # append never moves a block
        assert s.new_blocks == s.table_verify[len(s.table_before):]
        assert s.table_after == s.table_verify[:len(s.table_after)]
        assert set(s.freed_blocks) == set(s.table_verify) - set(s.table_after)
        assert sorted(s.free_queue + s.table_after) == list(range(need))        # no leak, no double free
        assert len(s.written_slots) == s.num_fed + d and len(s.discarded_slots) == d - a
        assert s.discarded_slots == s.written_slots[s.num_fed + a:]
        for phase in ("verify", "accept", "rollback"):
            states = [x for blk in s.slot_states(phase) for x in blk]
            assert len(states) == bs * len(s.table_after if phase == "rollback" else s.table_verify)
        acc = [x for blk in s.slot_states("accept") for x in blk]
        assert acc.count(SlotState.ACCEPTED) == a and acc.count(SlotState.REJECTED) == d - a
        after = [x for blk in s.slot_states("rollback") for x in blk]
        assert after.count(SlotState.VERIFIED) + after.count(SlotState.ACCEPTED) == s.num_kept
        assert s.passes == s.index + 1
        computed = s.num_kept
    assert computed == len(prompt) + len(target) - 1     # the last emitted token has no K/V yet


def test_a_full_replay_needs_ceil_of_p_plus_n_minus_one_blocks():
    prompt, target = [1, 2, 3, 1, 2, 3, 1], [2, 3, 1, 2, 3, 1, 2, 3, 1, 2]     # P + N - 1 = 16
    replay_speculation(prompt, target, NgramProposer(4, 2), block_size=4, num_blocks=4)
    with pytest.raises(BlockError, match=r"need 4 blocks of 4 tokens; the pool has 3 \(a full replay needs 4\)"):
        replay_speculation(prompt, target, NgramProposer(4, 2), block_size=4, num_blocks=3)


def test_max_steps_stops_early():
    trace = replay_speculation([1, 2, 1, 2], [1, 2, 1, 2, 1], NgramProposer(1, 1), block_size=2, num_blocks=8,
                               max_steps=2)
    assert trace.passes == 2 and trace.output_ids == (1, 2, 1, 2)[:len(trace.output_ids)]


def test_refusals():
    p = NgramProposer(2, 1)
    for prompt, target in (([], [1]), ([1], []), ([1, "a"], [1]), ([1], [-1]), ([True], [1]), (5, [1])):
        with pytest.raises(PromptError):
            replay_speculation(prompt, target, p, block_size=4, num_blocks=4)
    with pytest.raises(ConfigError, match="propose"):
        replay_speculation([1], [1], object(), block_size=4, num_blocks=4)
    with pytest.raises(ConfigError, match="max_steps"):
        replay_speculation([1], [1], p, block_size=4, num_blocks=4, max_steps=0)
    with pytest.raises(ConfigError):
        replay_speculation([1], [1], p, block_size=0, num_blocks=4)
    with pytest.raises(ConfigError, match="at most 1"):
        replay_speculation([1], [1, 2], Greedy(), block_size=4, num_blocks=4)
    with pytest.raises(ConfigError, match="phase"):
        replay_speculation([1], [1], p, block_size=4, num_blocks=4).steps[0].slot_states("draft")


class Greedy:
    """A proposer that ignores the limit."""

    def propose(self, tokens, limit):
        return [1, 1, 1]


def test_by_default_the_prefill_carries_no_draft():
    """As the engine and vLLM v1: the first pass runs the prompt alone and emits one token; the
    proposer is first asked at the second pass, with the prompt and that token."""
    proposer = Fixed([20, 99], [22])
    trace = replay_default([10, 11, 12, 13, 14, 15], [20, 21, 22, 23], proposer, block_size=4, num_blocks=4)
    first, second = trace.steps[:2]
    assert first.drafted == () and first.emitted == (20,) and first.num_fed == 6
    assert second.num_fed == 1 and second.drafted == (20, 99) and second.accepted == 0
    with pytest.raises(ConfigError, match="draft_at_prefill must be True or False"):
        replay_default([1], [2], proposer, block_size=4, num_blocks=4, draft_at_prefill=1)
