"""ByteTokenizer: UTF-8 bytes round-trip; bad ids and non-strings raise PromptError; slot labels
and incremental decoding never show U+FFFD for a character that is merely incomplete."""

import pytest
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
