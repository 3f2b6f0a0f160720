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


def test_live_requests_wait_when_out_of_blocks(small_model):
    live = LiveRequests(small_model, ByteTokenizer(), num_blocks=2, block_size=4)
    live.add("abcd")
    live.add("efgh")
    with pytest.raises(OutOfBlocksError):
        live.add("i")
    notes = live.step()
    assert len(notes) == 2 and "waits" in notes[0]
    live.finish(0)
    assert live.step() == [] and live.manager.num_tokens(1) == 5


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
        with pytest.raises(BlockError, match=r"request 99 is not running \(running: \[0\]\)"):
            call(99)
    live.finish(seq)
    with pytest.raises(BlockError, match="request 0 is not running"):
        live.text(seq)
