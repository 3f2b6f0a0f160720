"""ByteTokenizer: UTF-8 bytes round-trip; bad ids and non-strings raise PromptError."""

import pytest
from paged_kv.errors import PromptError
from paged_kv.model import ByteTokenizer


def test_tokenizer_round_trip_and_errors():
    tok = ByteTokenizer()
    text = "O Romeo, Romeo! wherefore art thou — Roméo?"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("é")) == 2
    with pytest.raises(PromptError, match="256"):
        tok.decode([72, 256])
