"""The recorded continuations (paged_kv/panels/continuations.json) are the tiny model's own greedy
output for every offered prompt, so the browser edition's replayed tokens cannot drift from it."""

import json

import pytest

from paged_kv.errors import ConfigError
from paged_kv.panels import continuations as cont
from paged_kv.panels.continuations import (CONTINUATION_BYTES, OFFERED_PROMPTS, load_recordings,
                                           record_continuation, whole_characters)


@pytest.fixture(scope="module")
def tiny():
    from paged_kv.model import load_tiny_model
    return load_tiny_model(device="cpu")


def test_the_file_holds_the_models_greedy_continuation_of_every_offered_prompt(tiny):
    model, tok = tiny
    got = load_recordings()
    assert sorted(got) == sorted(OFFERED_PROMPTS)
    for prompt in OFFERED_PROMPTS:
        assert got[prompt] == record_continuation(model, tok, prompt), f"{prompt!r}: rerun scripts/record_continuations.py"


def test_a_continuation_is_what_generate_decodes_with_the_contiguous_cache(tiny):
    """An independent path (generate(), no blocks) for two prompts: the recording is the model's."""
    from paged_kv.decoding import generate

    model, tok = tiny
    got = load_recordings()
    for prompt in ("To be, or not to be", "JULIET:\nO Romeo, Romeo!"):
        ids = tok.encode(prompt)
        want = generate(model, [ids], CONTINUATION_BYTES, cache="contiguous").tokens[0]
        assert got[prompt] == whole_characters(bytes(want))
        assert len(got[prompt].encode()) > CONTINUATION_BYTES - 4      # cut only to a whole character


def test_the_offered_prompts_are_the_panels_own():
    """Chapter 8's prefixes and the block pool's default text are offered (a panel that offers a
    prompt the list lacks would replay a stand-in for it)."""
    from paged_kv.widgets.prefix_cache import SYSTEM_PROMPTS

    for prefix in SYSTEM_PROMPTS:
        assert prefix + "what news?" in OFFERED_PROMPTS and prefix + "how now?" in OFFERED_PROMPTS
    assert "To be, or not to be" in OFFERED_PROMPTS and len(set(OFFERED_PROMPTS)) == len(OFFERED_PROMPTS)


def test_whole_characters_cuts_a_character_and_stops_at_a_bad_byte():
    assert whole_characters("abé".encode()) == "abé"
    assert whole_characters("abé".encode()[:-1]) == "ab"            # "é" cut after its first byte
    assert whole_characters(b"ab\xffcd") == "ab"                    # 0xFF is never UTF-8


def test_a_broken_file_is_refused_with_what_to_do(monkeypatch, tmp_path):
    class Files:
        def __init__(self, text):
            self.text = text

        def joinpath(self, name):
            return self

        def read_text(self, encoding):
            if self.text is None:
                raise FileNotFoundError(cont.RECORDINGS_FILE)
            return self.text

    for text, match in ((None, "missing"), (json.dumps({"continuations": {"a": 1}}), "must hold"),
                        (json.dumps(["a"]), "must hold")):
        monkeypatch.setattr(cont.resources, "files", lambda pkg, t=text: Files(t))
        with pytest.raises(ConfigError, match=match):
            load_recordings()


def test_record_continuation_refuses_a_bad_length(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match="num_bytes"):
        record_continuation(model, tok, "To be", 0)
