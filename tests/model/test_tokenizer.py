"""ByteTokenizer: UTF-8 bytes round-trip; bad ids and non-strings raise PromptError; slot labels
and incremental decoding never show U+FFFD for a character that is merely incomplete."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.errors import PromptError
from paged_kv.model import ByteTokenizer
from paged_kv.model.tokenizer import CONTINUATION

TEXT = "Roméo — 🌹!"          # 2-byte é, 3-byte em dash, 4-byte emoji


def test_tokenizer_round_trip_and_errors():
    tok = ByteTokenizer()
    text = "O Romeo, Romeo! wherefore art thou — Roméo?"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("é")) == 2
    with pytest.raises(PromptError, match="256"):
        tok.decode([72, 256])
    with pytest.raises(PromptError, match="got \\[300\\]"):
        tok.token_labels([300])


def test_labels_show_each_character_on_its_first_byte():
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    labels = tok.token_labels(ids)
    assert len(labels) == len(ids)
    expect = []                                    # built character by character, independently
    for ch in TEXT:
        expect += [ch] + [CONTINUATION] * (len(ch.encode("utf-8")) - 1)
    assert labels == expect
    assert "\ufffd" not in labels and "".join(l for l in labels if l != CONTINUATION) == TEXT


def test_every_prefix_decodes_without_replacement_characters():
    """As a request generates byte by byte, every prefix's text and labels hold no U+FFFD; the text
    is the longest prefix of the characters whose bytes have all arrived."""
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    for n in range(len(ids) + 1):
        text = tok.decode(ids[:n], final=False)
        assert "\ufffd" not in text and "\ufffd" not in tok.token_labels(ids[:n])
        complete = [ch for k, ch in enumerate(TEXT) if len(TEXT[:k + 1].encode("utf-8")) <= n]
        assert text == "".join(complete)
    assert tok.decode(ids[:-4] + ids[-3:-1]).endswith("\ufffd")     # final: a cut character is shown broken


def test_invalid_bytes_are_marked_not_hidden():
    tok = ByteTokenizer()
    assert tok.token_labels([0x80, 65]) == ["\ufffd", "A"]             # a lone continuation byte
    assert tok.token_labels([0xC3, 65]) == ["\ufffd", "A"]             # a lead byte without its continuation
    assert tok.decode([0xFF], final=False) == "\ufffd"


def _is_surrogate(ch: str) -> bool:
    return 0xD800 <= ord(ch) <= 0xDFFF


@pytest.mark.parametrize("text, index, code", [
    ("smile \ud83d", 6, "U+D83D"),                    # the prompt: a lone high surrogate
    ("\udc00 at the start", 0, "U+DC00"),              # a lone low surrogate
    ("ok 🌹 \ud800 then \udfff", 5, "U+D800"),         # several: the first is named, after an emoji
    ("pair \ud83d\ude00 escaped", 5, "U+D83D"),        # a UTF-16 pair written as two escapes
])
def test_text_with_a_surrogate_is_a_prompt_error_naming_the_first(text, index, code):
    """A surrogate has no UTF-8 bytes: the tokenizer raised a bare UnicodeEncodeError."""
    with pytest.raises(PromptError, match=re.escape(f"character {index} is {code},")):
        ByteTokenizer().encode(text)


def test_the_message_counts_the_others_and_names_a_pair():
    tok = ByteTokenizer()
    with pytest.raises(PromptError, match="; 1 more surrogate after it") as caught:
        tok.encode("ok \ud800 then \udfff")
    assert "lone high surrogate" in str(caught.value)
    with pytest.raises(PromptError, match="stands for U\\+1F600 '😀'") as caught:
        tok.encode("pair \ud83d\ude00 escaped")
    assert "a high surrogate" in str(caught.value) and "lone" not in str(caught.value)


def test_valid_text_encodes_as_before():
    """Emoji, combining marks, NUL and the last code point keep their exact UTF-8 bytes."""
    tok = ByteTokenizer()
    for text in ("", "\x00", "e\u0301", "🌹", "\U0010ffff", TEXT, "\ud7ff\ue000"):  # next to the surrogates
        assert tok.encode(text) == list(text.encode("utf-8"))
        assert tok.decode(tok.encode(text)) == text


# hypothesis' text() leaves surrogates (category Cs) out unless asked: mix them in
ANY_CHARACTER = st.one_of(st.characters(), st.characters(categories=["Cs"]))


@settings(max_examples=300, deadline=None)
@given(st.text(ANY_CHARACTER))
def test_any_text_round_trips_or_names_its_first_surrogate(text):
    """Any str, surrogates included: either the text round-trips, or the error names the index and
    code point of its first surrogate."""
    tok = ByteTokenizer()
    try:
        ids = tok.encode(text)
    except PromptError as e:
        i = int(re.search(r"character (\d+) is U\+([0-9A-F]{4})", str(e)).group(1))
        assert _is_surrogate(text[i]) and not any(map(_is_surrogate, text[:i]))
        assert f"U+{ord(text[i]):04X}" in str(e)
    else:
        assert not any(map(_is_surrogate, text))
        assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=24))
def test_every_incremental_decode_is_a_prefix_of_the_final_one(data):
    """Any bytes (the model may sample invalid ones): the text of a sequence still growing is a
    prefix of its final text, so a running request's text never has to be taken back."""
    tok = ByteTokenizer()
    final = tok.decode(data)
    for n in range(len(data) + 1):
        assert final.startswith(tok.decode(data[:n], final=False))
