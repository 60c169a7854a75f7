"""The Python side of ``BatchHits`` without a JVM: ``decode_hits`` on chunks built by hand in the encoding
``turngym/corpora/java/BatchHits.java`` describes (fields each followed by U+0001; counts, scores, document
numbers, then the docids and stored documents first sent in the chunk; the escaped form), and ``parse_raw``
on stored documents Python's JSON reader refuses."""

from __future__ import annotations

import json

import pytest

from turngym.corpora.lucene import Hit, RetrieverError, SentDocs, decode_hits, parse_raw

SEP, ESC = "\x01", "\x02"


def chunk(*fields: str) -> str:
    """A chunk as BatchHits sends it: each field followed by one separator."""
    return "".join(f + SEP for f in fields)


def doc(docid: str, title: str, text: str) -> str:
    return json.dumps({"id": docid, "title": title, "text": text})


def test_a_chunk_decodes_to_each_querys_hits_and_later_chunks_name_earlier_documents():
    docs = SentDocs()
    first = chunk("", "2", "1",                       # hits per query
                  "1.5", "0.25", "2.0",               # scores
                  "0", "1", "0",                      # document numbers
                  "anserini-0", "anserini-1",         # docids of the two new documents
                  doc("x0", "T0", "alpha"), '{"contents": "\\"T1\\"\\nbeta"}')
    assert decode_hits(first, 2, docs) == [
        [Hit("x0", 1.5, "T0", "alpha"), Hit("anserini-1", 0.25, "T1", "beta")],  # the document's own id first
        [Hit("x0", 2.0, "T0", "alpha")]]
    # a later chunk of the same batch: one new document (number 2), the others by their numbers only
    later = chunk("", "0", "2", "3.0", "1.0", "2", "1", "anserini-2", "")
    assert decode_hits(later, 2, docs) == [[], [Hit("anserini-2", 3.0, "", ""), Hit("anserini-1", 1.0, "T1", "beta")]]


def test_a_chunk_without_its_trailing_separator_or_with_a_bad_start_is_refused():
    good = chunk("", "1", "1.0", "0", "d", "text")
    assert decode_hits(good, 1)[0][0].docid == "d"
    with pytest.raises(RetrieverError, match="ends with 'text'"):
        decode_hits(good[:-1], 1)  # cut short: the last field has no separator after it
    with pytest.raises(RetrieverError, match="starts with 'x'"):
        decode_hits("x" + good, 1)


@pytest.mark.parametrize("fields", [
    ("", "1", "1.0", "0", "d"),                  # a docid without its stored document
    ("", "3", "1.0", "0", "d", "text"),          # three hits counted, one sent
])
def test_a_field_count_no_chunk_makes_is_refused(fields):
    with pytest.raises(RetrieverError, match="which no 1 queries"):
        decode_hits(chunk(*fields), 1)


@pytest.mark.parametrize(("fields", "message"), [
    (("", "2", "1.0", "0", "d", "text"), "not all numbers"),  # two hits counted, one sent: a docid read as one
    (("", "one", "1.0", "0", "d", "text"), "not numbers"),
    (("", "1", "1.0", "-1", "d", "text"), "has not sent"),
])
def test_a_field_that_should_be_a_number_and_is_not_is_refused(fields, message):
    with pytest.raises(RetrieverError, match=message):
        decode_hits(chunk(*fields), 1)


def test_a_hit_naming_a_document_not_sent_is_refused():
    with pytest.raises(RetrieverError, match="has not sent"):
        decode_hits(chunk("", "1", "1.0", "1", "d", "text"), 1)


def test_the_escaped_form_gives_back_separators_and_escapes_in_docids_and_documents():
    # docid "a<SEP>b" and a stored text with an escape character and a separator in it
    sent_id = "a" + ESC + "\x03" + "b"
    sent_raw = "plain" + ESC + ESC + "text" + ESC + "\x03" + "end"
    (hits,) = decode_hits(ESC + SEP + chunk("1", "0.5", "0", sent_id, sent_raw), 1)
    assert hits == [Hit("a" + SEP + "b", 0.5, "", "plain" + ESC + "text" + SEP + "end")]
    # without the escape flag the same fields are taken as they are
    (plain,) = decode_hits(chunk("", "1", "0.5", "0", "a" + ESC + "\x03" + "b", "x"), 1)
    assert plain[0].docid == "a" + ESC + "\x03" + "b"


HUGE_INT = '{"id": "big", "title": "t", "text": "x", "n": ' + "7" * 5000 + "}"  # past Python's 4300 digits
DEEP = '{"id": "deep", "text": ' + "[" * 100_000 + "]" * 100_000 + "}"  # past the recursion limit


@pytest.mark.parametrize("raw", [HUGE_INT, DEEP, "not json {", "[1, 2]"])
def test_a_stored_document_pythons_json_reader_refuses_is_kept_as_its_text(raw):
    assert parse_raw(raw) == (None, "", raw)


def test_one_such_document_does_not_fail_its_batch():
    (hits,) = decode_hits(chunk("", "3", "3.0", "2.0", "1.0", "0", "1", "2", "d0", "d1", "d2",
                                HUGE_INT, DEEP, doc("ok", "T", "fine")), 1)
    assert hits == [Hit("d0", 3.0, "", HUGE_INT), Hit("d1", 2.0, "", DEEP), Hit("ok", 1.0, "T", "fine")]
