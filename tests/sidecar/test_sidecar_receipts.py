"""Receipts have exactly one text form, so one lease cannot be named by two strings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketq.core.message import MAX_POSITION, Receipt
from bucketq.errors import InvalidReceipt

topics = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
positions = st.integers(min_value=0, max_value=MAX_POSITION)
tokens = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
receipts = st.builds(Receipt, topics, positions, positions, positions, tokens)


@given(receipts)
def test_encode_then_decode_is_the_identity(receipt: Receipt) -> None:
    assert Receipt.decode(receipt.encode()) == receipt


@given(st.text(alphabet="orders0123456789:+- _\n\t.abcdef\u0660", max_size=40))
def test_a_decoded_text_is_the_canonical_text(text: str) -> None:
    try:
        receipt = Receipt.decode(text)
    except InvalidReceipt:
        return
    assert receipt.encode() == text


@given(receipts, st.sampled_from(["+{}", " {}", "{} ", "0{}", "-{}", "{}\n", "{}_0"]))
def test_aliases_of_a_number_are_refused(receipt: Receipt, alias: str) -> None:
    parts = receipt.encode().split(":")
    parts[2] = alias.format(parts[2])
    with pytest.raises(InvalidReceipt):
        Receipt.decode(":".join(parts))


@pytest.mark.parametrize("text", ["t:0:0:0:ab", "t:0:0:0:ab\n", "t:0:0:00:ab", f"t:0:{2**63}:0:ab"])
def test_examples(text: str) -> None:
    if text == "t:0:0:0:ab":
        assert Receipt.decode(text).encode() == text
    else:
        with pytest.raises(InvalidReceipt):
            Receipt.decode(text)
