"""RequestOutput.text while a request streams: a character whose bytes have not all been sampled is
held back (never shown as U+FFFD that a later step takes back), so every running snapshot's text is a
prefix of the final text; once finished, the text is the final decode."""

from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.engine import EngineConfig, LLMEngine, RequestOutput
from paged_kv.model import ByteTokenizer, SamplingParams
from paged_kv.scheduling import Request
from paged_kv.scheduling.request import Sequence

TOK = ByteTokenizer()

# a sample's bytes: mostly valid UTF-8 (multi-byte characters included), sometimes arbitrary bytes,
# as a model with 256 byte tokens may sample anything
SAMPLE_BYTES = st.one_of(st.text(min_size=1, max_size=8).map(str.encode), st.binary(min_size=1, max_size=12))


@settings(max_examples=200, deadline=None)
@given(samples=st.lists(SAMPLE_BYTES, min_size=1, max_size=3), data=st.data())
def test_a_running_requests_text_is_always_a_prefix_of_its_final_text(samples, data):
    """A real Request whose samples grow by one byte per step (the samples after the first fork at
    some step, as a group's do): after every step each sample's text is a prefix of its final text,
    and once the request is finished the text is the final decode itself."""
    length = min(map(len, samples))                    # every sample generates max_tokens
    samples = [s[:length] for s in samples]
    final = [TOK.decode(s) for s in samples]
    req = Request("r", [0], n=len(samples), max_tokens=length)
    req.seqs.append(Sequence(0, [0], 1, index=0))
    out = RequestOutput("r", [0], req, TOK)
    fork_at = data.draw(st.integers(0, length - 1), label="siblings fork after this many tokens")
    for step in range(length):
        if step == fork_at:
            req.seqs += [Sequence(i, list(req.seqs[0].tokens[:1]), 1, index=i) for i in range(1, len(samples))]
            for seq in req.seqs[1:]:
                seq.tokens += samples[seq.index][:step]
        for seq in req.seqs:
            seq.tokens.append(samples[seq.index][step])
            req.note_token(seq)                        # the scheduler's rule: max_tokens ends it
        assert out.finished == (step == length - 1)
        for text, whole in zip(out.text, final):
            assert whole.startswith(text)
    assert out.text == final


def test_a_character_cut_by_a_step_is_held_back_until_its_last_byte():
    """'é' is bytes C3 A9: after the first, the running text does not show U+FFFD; a request that
    finishes on that lone byte shows it broken (no byte will complete it)."""
    req = Request("r", [0], n=1, max_tokens=3)
    req.seqs.append(Sequence(0, [0], 1))
    out = RequestOutput("r", [0], req, TOK)
    texts = []
    for b in "aé".encode():
        req.seqs[0].tokens.append(b)
        req.note_token(req.seqs[0])
        texts.append(out.text[0])
    assert texts == ["a", "a", "aé"] and out.finished
    cut = Request("c", [0], n=1, max_tokens=2)
    cut.seqs.append(Sequence(0, [0, ord("a"), 0xC3], 1))
    cut.note_token(cut.seqs[0])
    assert RequestOutput("c", [0], cut, TOK).text == ["a\ufffd"]


def test_the_engines_streaming_texts_are_prefixes_of_the_final_texts(small_model):
    """Sampled with temperature from a random model over 256 byte tokens, through LLMEngine, step by
    step: every running snapshot of every sample is a prefix of its final text.  The sweep must hold
    at least one character back mid-way, or it would not test the incremental decode."""
    held_back = 0
    for seed in range(3):
        engine = LLMEngine(small_model, EngineConfig(block_size=4, num_gpu_blocks=32, watermark=0.0),
                           tokenizer=TOK)
        engine.add_request("To be, or not", SamplingParams(max_tokens=12, n=2, temperature=1.0, seed=seed), "A")
        engine.add_request("abc", SamplingParams(max_tokens=10, temperature=1.5, seed=seed + 10), "B")
        snapshots = []
        while engine.has_unfinished_requests():
            engine.step()
            for o in engine.outputs():
                if not o.finished:
                    snapshots += [(o.request_id, i, t) for i, t in enumerate(o.text)]
                    held_back += sum(t != TOK.decode(ids) for t, ids in zip(o.text, o.token_ids))
        final = {o.request_id: o.text for o in engine.outputs()}
        assert all(o.finished for o in engine.outputs())
        for rid, i, text in snapshots:
            assert final[rid][i].startswith(text), (seed, rid, i, text, final[rid][i])
    assert held_back > 0
