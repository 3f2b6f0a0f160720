"""The live block panel's serving loop (LiveRequests): same tokens as generate, waiting, bad input."""

import pytest
from paged_kv.errors import BlockError, OutOfBlocksError, PromptError
from paged_kv.decoding import generate
from paged_kv.model import ByteTokenizer
from paged_kv.engine import LiveRequests


def test_live_requests_decode_the_same_tokens_as_generate(small_model):
    """Two requests arriving at different times, sharing one pool, each decode exactly the greedy
    tokens generate() gives for it alone with the contiguous cache."""
    tok = ByteTokenizer()
    live = LiveRequests(small_model, tok, num_blocks=12, block_size=4)
    a = live.add("Four score and seven")
    live.step(), live.step()
    b = live.add("It was")
    for _ in range(5):
        assert live.step() == []
    for seq, prompt, n in ((a, "Four score and seven", 8), (b, "It was", 6)):
        ids = tok.encode(prompt)
        want = generate(small_model, [ids], n, cache="contiguous").tokens[0]
        assert live.tokens[seq][len(ids):] + [live.pending[seq]] == want
    live.manager.check()


def test_a_full_pool_preempts_the_latest_request_which_is_recomputed(small_model):
    """vLLM paper §4.5: when request 0 needs a block and none is free, the latest arrival (1) is
    preempted by recompute; once blocks are free it is prefilled again with all its tokens and
    continues exactly as generate() would have decoded it alone."""
    tok = ByteTokenizer()
    live = LiveRequests(small_model, tok, num_blocks=2, block_size=4)
    a, b = live.add("abcd"), live.add("ef")           # block 0 full, block 1 half full
    notes = live.step()                               # 0 needs a 2nd block: none free -> preempt 1
    assert live.running == [a] and list(live.waiting) == [b] and "request 1 preempted" in notes[0]
    assert notes[0].startswith("request 0 needs a block, none free")   # who asked, and who paid
    assert live.history.events[-2].kind == "preempt" and live.history.events[-2].freed_blocks == (1,)
    assert live.manager.num_tokens(a) == 5
    assert "waits to be recomputed" in live.step()[0]  # 0 holds both blocks now
    with pytest.raises(BlockError, match="waiting to be recomputed"):
        live.add("x")                                 # FCFS: the preempted request goes first
    live.finish(a)
    assert "readmitted" in live.step()[0] and live.running == [b]
    for _ in range(3):
        live.step()
    want = generate(small_model, [tok.encode("ef")], 5, cache="contiguous").tokens[0]
    assert live.tokens[b][2:] + [live.pending[b]] == want
    live.manager.check()


def test_a_request_alone_in_a_full_pool_waits():
    live = LiveRequests(None, None, num_blocks=1, block_size=2)
    live.add(2)
    assert "nobody to preempt" in live.step()[0] and live.running == [0] and not live.waiting


def test_slot_labels_and_text_of_multibyte_characters_across_a_block_boundary(small_model):
    """é (2 bytes), — (3) and an emoji (4) in a prompt whose blocks of 4 cut through each of them:
    every slot shows the character on its first byte and a continuation mark on the others, and
    the request's text never holds U+FFFD."""
    from paged_kv.model.tokenizer import CONTINUATION
    tok = ByteTokenizer()
    prompt = "abé—🌹"                                  # bytes: a b | C3 A9 | E2 80 94 | F0 9F 8C B9
    live = LiveRequests(small_model, tok, num_blocks=8, block_size=4)
    seq = live.add(prompt)
    snap = live.history.snapshots[-1]
    labels = [lab for b in live.manager.block_table(seq).block_ids for lab in snap.blocks[b].labels]
    assert labels == ["a", "b", "é", CONTINUATION, "—", CONTINUATION, CONTINUATION,
                      "🌹", CONTINUATION, CONTINUATION, CONTINUATION]
    assert [len(snap.blocks[b].labels) for b in live.manager.block_table(seq).block_ids] == [4, 4, 3]
    for _ in range(6):
        live.step()
        assert "\ufffd" not in live.text(seq) or "\ufffd" in tok.decode(live.tokens[seq], final=False)
    assert live.text(seq).startswith(prompt)


@pytest.mark.parametrize("bad,match", [(-3, "must be an int >= 1, got -3"), (0, "got 0"), (2.7, "must be an int >= \\d+, got 2.7"),
                                       (True, "must be an int"), ("", "has no tokens")])
def test_live_requests_reject_bad_prompts_by_value(bad, match):
    live = LiveRequests(None, None, num_blocks=4, block_size=2)
    with pytest.raises(PromptError, match=match):
        live.add(bad)
    assert live.running == [] and live.manager.num_free_blocks == 4 and len(live.history.snapshots) == 1


def test_live_requests_text_and_finish_of_unknown_request():
    live = LiveRequests(None, None, num_blocks=4, block_size=2)
    seq = live.add(3)
    assert live.text(seq) == ""
    for call in (live.text, live.finish):
        with pytest.raises(BlockError, match=r"request 99 is not running or waiting \(running: \[0\]"):
            call(99)
    live.finish(seq)
    with pytest.raises(BlockError, match="request 0 is not running"):
        live.text(seq)


def test_random_sessions_keep_every_invariant():
    """Hypothesis drives add / step / finish over a small pool (preemptions happen often): the
    manager's invariants hold, every request is running xor waiting, a running request holds one
    slot per token, a waiting one holds no block, and a preempted request is never older than a
    request that kept running in that step (the latest arrival goes first)."""
    from hypothesis import given, settings, strategies as st

    ops = st.lists(st.tuples(st.sampled_from(["add", "step", "step", "finish"]), st.integers(1, 9)),
                   max_size=40)

    @settings(max_examples=30, deadline=None)
    @given(ops)
    def run(script):
        live = LiveRequests(None, None, num_blocks=6, block_size=2)
        for op, arg in script:
            try:
                if op == "add":
                    live.add(arg)
                elif op == "step":
                    before = set(live.running)
                    live.step()
                    preempted = before - set(live.running)
                    if preempted:
                        assert min(preempted) > max(before - preempted, default=-1)
                elif live.requests:
                    live.finish(live.requests[arg % len(live.requests)])
            except (OutOfBlocksError, BlockError):
                pass                                   # refused: nothing changed
            live.manager.check()
            assert set(live.running).isdisjoint(live.waiting)
            assert set(live.requests) == set(live.tokens)
            for s in live.running:
                assert live.manager.num_tokens(s) == len(live.tokens[s])
            assert all(s not in live.manager.seq_ids for s in live.waiting)

    run()


def test_appending_to_one_child_copies_the_shared_last_block_for_it_alone():
    """vLLM paper §4.4: a 13-token prompt in blocks of 4 (the last block holds 1 token) forked into
    two children: every block has three holders.  One token for child 1 alone copies the partly
    filled last block for child 1 only (the copy has one holder, the shared block one fewer); the
    parent and child 2 keep their tokens and blocks.  Finishing child 1 returns exactly its copy."""
    live = LiveRequests(None, None, num_blocks=8, block_size=4)
    root = live.add(13)
    kids = [live.fork(root), live.fork(root)]
    alloc = live.manager.allocator
    shared = live.manager.block_table(root).block_ids
    assert [alloc.ref_count(b) for b in shared] == [3, 3, 3, 3] and live.manager.num_free_blocks == 4
    assert live.step(only=kids[0]) == []
    own = live.manager.block_table(kids[0]).block_ids
    assert own[:3] == shared[:3] and own[3] not in shared                  # its own copy of the last block
    assert live.history.events[-1].copies == ((shared[3], own[3]),)
    assert [alloc.ref_count(b) for b in shared] == [3, 3, 3, 2] and alloc.ref_count(own[3]) == 1
    for seq in (root, kids[1]):                                           # untouched
        assert live.manager.block_table(seq).block_ids == shared and live.manager.num_tokens(seq) == 13
    assert live.manager.num_tokens(kids[0]) == 14 and len(live.tokens[kids[0]]) == 14
    free = live.manager.num_free_blocks
    live.finish(kids[0])
    assert live.history.events[-1].freed_blocks == (own[3],)              # its own block, nothing shared
    assert live.manager.num_free_blocks == free + 1
    assert [alloc.ref_count(b) for b in shared] == [2, 2, 2, 2]
    live.manager.check()


def test_appending_to_one_request_in_a_full_pool_preempts_the_latest_arrival():
    """The same rule as a full step (§4.5): appending to request 0 preempts the latest arrival (1);
    appending to the latest arrival itself preempts it, and readmission waits for a full step."""
    live = LiveRequests(None, None, num_blocks=3, block_size=2)
    a, b, c = live.add(2), live.add(2), live.add(2)                     # every block full
    notes = live.step(only=a)
    assert notes == ["request 0 needs a block, none free: request 2 preempted (latest arrival), to be recomputed"]
    assert live.running == [a, b] and list(live.waiting) == [c] and live.manager.num_tokens(a) == 3
    live.finish(a)                                                      # two blocks free
    assert live.step(only=b) == [] and list(live.waiting) == [c]        # appending readmits nobody
    notes = live.step()          # 2 is readmitted into the last block, then needs one more: itself
    assert notes[0].startswith("request 2 readmitted") and notes[1].startswith("request 2 needs a block")
    assert live.running == [b] and list(live.waiting) == [c]
    live.manager.check()
    with pytest.raises(BlockError, match="request 2 is waiting to be recomputed"):
        live.step(only=c)
    assert live.manager.num_tokens(b) == 4 and list(live.waiting) == [c]


@pytest.mark.parametrize("bad", [7, -1, True, "0", [0], 0.5])
def test_appending_to_a_request_that_is_not_running_is_refused_by_value(bad):
    live = LiveRequests(None, None, num_blocks=4, block_size=2)
    live.add(3)
    with pytest.raises(BlockError, match="is not running"):
        live.step(only=bad)
    assert live.manager.num_tokens(0) == 3 and len(live.history.snapshots) == 2


def test_preempt_frees_the_blocks_and_queues_the_request_for_recompute():
    live = LiveRequests(None, None, num_blocks=4, block_size=2)
    a, b = live.add(3), live.add(2)
    live.preempt(a, "by the reader")
    assert live.running == [b] and list(live.waiting) == [a] and a not in live.pending
    assert live.manager.num_free_blocks == 3 and "preempted (by the reader)" in live.history.events[-1].text
    with pytest.raises(BlockError, match="request 0 is already preempted"):
        live.preempt(a)
    with pytest.raises(BlockError, match="request 5 is not running"):
        live.preempt(5)
    assert "request 0 readmitted" in live.step()[0] and sorted(live.running) == [0, 1]
