"""Secrets in every shape the content policy knows, through every destination: the store
file and its WAL, the OTLP payload, and ``loopscope collect``. Each case says what must
vanish and what must stay (the scheme, the host, the key's name; text that only looks
like a secret, such as ``max_tokens=5``, stays whole)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from fakes import otlp_receiver
from loopscope.content.policy import ContentPolicy
from loopscope.content.secrets import DEFAULT_PREFILTERS, SECRET_SHAPES
from loopscope.ingest.otlp.collector import Collector
from loopscope.storage.duckdb import writer as writer_module
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.scrub import prefilter


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    vanish: tuple[str, ...]
    stay: tuple[str, ...]


PEM_BODY = "MIIEowIBAAKCAQEA7bqSECRETPEMBODYLINE1\nK3y8Zq0SECRETPEMBODYLINE2AbCdEf=="
CASES = (
    # -- what issue 15 found kept --
    Case("basic authorization", "curl -H 'Authorization: Basic QkFTSUNzZWNyZXQ6cGFzc3dvcmQ=' https://api.test",
         ("QkFTSUNzZWNyZXQ6cGFzc3dvcmQ=",), ("Authorization: Basic [REDACTED]", "https://api.test")),
    Case("aws secret access key", "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY\nregion=us-east-1",
         ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY",), ("aws_secret_access_key=[REDACTED]", "region=us-east-1")),
    Case("token parameter", "POST https://hooks.test/notify?token=tkn5f4e3d2c1b0a99&channel=ops",
         ("tkn5f4e3d2c1b0a99",), ("token=[REDACTED]", "channel=ops")),
    Case("key parameter", "GET https://maps.test/api/geocode?key=MAPSk3y0123456789&q=paris",
         ("MAPSk3y0123456789",), ("?key=[REDACTED]", "q=paris")),
    Case("sig parameter", "https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&sr=b&sig=Rk9PQkFSc2lnbmF0dXJlMTIz%3D",
         ("Rk9PQkFSc2lnbmF0dXJlMTIz",), ("sv=2022-11-02", "&sig=[REDACTED]")),
    Case("url credentials", "connect to postgres://admin:S3cr3tPassw0rd@db.internal:5432/orders now",
         ("S3cr3tPassw0rd", "admin:"), ("postgres://[REDACTED]@db.internal:5432/orders",)),
    Case("url password without a user", "REDIS_URL=redis://:r3disPassw0rd@cache.internal:6379/0",
         ("r3disPassw0rd",), ("redis://[REDACTED]@cache.internal:6379/0",)),
    Case("cookie header", "Cookie: session_id=c00k1e5e55ion; csrftoken=csrfv4lue99\r\nAccept: */*",
         ("c00k1e5e55ion", "csrfv4lue99"), ("Cookie: [REDACTED]", "Accept: */*")),
    Case("set-cookie header", "Set-Cookie: sid=31d4d96e407aad42; Path=/; Secure; HttpOnly",
         ("31d4d96e407aad42",), ("Set-Cookie: [REDACTED]",)),
    Case("pem private key", f"key file:\n-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\nend",
         ("SECRETPEMBODYLINE1", "SECRETPEMBODYLINE2"),
         ("-----BEGIN RSA PRIVATE KEY-----[REDACTED]-----END RSA PRIVATE KEY-----", "key file:")),
    Case("openssh private key", f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----",
         ("SECRETPEMBODYLINE1", "SECRETPEMBODYLINE2"), ("-----BEGIN OPENSSH PRIVATE KEY-----[REDACTED]",)),
    # -- the other shapes of the table --
    Case("aws access key id", "aws_access_key_id = AKIAIOSFODNN7SECRET1", ("AKIAIOSFODNN7SECRET1",), ("aws_access_key_id = [REDACTED]",)),
    Case("azure account key", "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=QXp1cmVLZXkwMTIzNDU2Nzg5==;EndpointSuffix=core.windows.net",
         ("QXp1cmVLZXkwMTIzNDU2Nzg5",), ("AccountName=acme", "AccountKey=[REDACTED];EndpointSuffix=core.windows.net")),
    Case("client secret in json", '{"client_id": "app-123", "client_secret": "cs9f8e7d6c5b4aSECRET"}',
         ("cs9f8e7d6c5b4aSECRET",), ('"client_id": "app-123"', '"client_secret": "[REDACTED]"')),
    Case("s3 presigned url",
         "https://bucket.s3.amazonaws.com/report.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7SECRET2%2F20240101%2Fus-east-1"
         "&X-Amz-Date=20240101T000000Z&X-Amz-Security-Token=FwoGZXIvYXdzSECRETSESSION&X-Amz-Signature=9c1e0a77f00dSECRETSIG",
         ("AKIAIOSFODNN7SECRET2", "FwoGZXIvYXdzSECRETSESSION", "9c1e0a77f00dSECRETSIG"),
         ("bucket.s3.amazonaws.com/report.pdf", "X-Amz-Date=20240101T000000Z", "X-Amz-Signature=[REDACTED]")),
    Case("access_token", "redirect to /cb#access_token=ya29SECRETACCESSTOKEN&expires_in=3599",
         ("ya29SECRETACCESSTOKEN",), ("access_token=[REDACTED]", "expires_in=3599")),
    Case("api_key and apikey", "call with api_key=ak_SECRETAPIKEY1 or apikey: ak_SECRETAPIKEY2",
         ("ak_SECRETAPIKEY1", "ak_SECRETAPIKEY2"), ("api_key=[REDACTED]", "apikey: [REDACTED]")),
    Case("password and secret", "password=Tr0ub4dourSECRET secret: s3cr3tSECRET", ("Tr0ub4dourSECRET", "s3cr3tSECRET"),
         ("password=[REDACTED]", "secret: [REDACTED]")),
    Case("bearer authorization", "Authorization: Bearer opaqueSECRETBEARER123", ("opaqueSECRETBEARER123",), ("Authorization: Bearer [REDACTED]",)),
    Case("jwt", "id=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
         ("eyJzdWIiOiIxMjM0NTY3ODkwIn0", "dozjgNryP4J3jVmNHl0w5N"), ("id=[REDACTED]",)),
    Case("openai key", "OPENAI_API_KEY is sk-proj-SECRETOPENAIKEY1234567", ("SECRETOPENAIKEY",), ("OPENAI_API_KEY is [REDACTED]",)),
    Case("github token", "git push https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r",
         ("ghp_16C7e42F292c6912E7710c838347Ae178B4a",), ("@github.com/o/r",)),
    Case("signature query parameter", "https://cdn.test/v.mp4?expires=1700000000&signature=c2lnbmVkVVJMc2VjcmV0",
         ("c2lnbmVkVVJMc2VjcmV0",), ("expires=1700000000&signature=[REDACTED]",)),
    # -- text that only looks like a secret: kept whole --
    Case("token counts", "usage: input_tokens=120, output_tokens=20, max_tokens=5, total_tokens: 145", (), ("input_tokens=120", "max_tokens=5", "total_tokens: 145")),
    Case("token counts in json", '{"input_tokens": 120, "max_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}', (),
         ('"input_tokens": 120', '"max_tokens": 5', '"cached_tokens": 0')),
    Case("a model's tokens", '{"token": "Hello", "logprob": -0.02}, {"token": " world", "logprob": -0.5}', (),
         ('"token": "Hello"', '"token": " world"')),
    Case("key= in prose", "the key=value syntax; a monkey=banana map; sort_key=created_at; sig= is short for signal", (),
         ("the key=value syntax", "monkey=banana", "sort_key=created_at", "sig= is short")),
    Case("a thinking block's signature", '{"type": "thinking", "thinking": "Let me see.", "signature": "EqQBCkYIBBgCIkBz9thinking"}', (),
         ('"signature": "EqQBCkYIBBgCIkBz9thinking"',)),
    Case("plain urls", "see https://example.com/docs?page=2&sort=asc and http://localhost:8080/x@y", (),
         ("https://example.com/docs?page=2&sort=asc", "http://localhost:8080/x@y")),
    Case("public key", "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----", (),
         ("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE",)),
)


# -- recording every case, and what each destination kept ---------------------------------------


def record_cases() -> None:
    """One turn per case: the text as the user's input, the model's round text, a tool's
    argument (JSON) and the tool's result."""

    @loopscope.tool
    def echo(text: str) -> str:
        return text

    for i, case in enumerate(CASES):
        with loopscope.turn(session_id=f"case-{i}", agent="sec", input=case.text, model="m", provider="openai") as t:
            t.generation(case.text, tool_calls=[{"id": f"c{i}", "name": "echo", "arguments": {"text": case.text}}])
            echo(case.text)
            t.generation("done", finish_reason="stop")


def stored_texts(db: Path) -> dict[int, list[str]]:
    """Per case, every text the store holds of it: input, round text, tool argument, result."""
    with open_store(str(db.resolve()), read_only=True) as con:
        rows = con.execute("SELECT session_id, type, content::VARCHAR FROM events WHERE session_id LIKE 'case-%' ORDER BY session_id, idx").fetchall()
    out: dict[int, list[str]] = {}
    for session, kind, content in rows:
        value = json.loads(content)
        texts = out.setdefault(int(session.split("-")[1]), [])
        if kind == "message" and value["body"] != "done":
            texts.append(value["body"])
        elif kind == "tool_call_end":
            assert isinstance(value["arguments"], dict), "the tool's arguments stay a JSON object"
            texts += [value["arguments"]["text"], value["result"]]
    return out


def raw_bytes(path: Path) -> bytes:
    assert path.exists() and path.stat().st_size > 0, f"{path.name} is missing"
    return path.read_bytes()


def check(texts: dict[int, list[str]], blobs: dict[str, bytes], places: int) -> None:
    """Every case's secrets are in no text and no raw file; what must stay stays."""
    failures = []
    for i, case in enumerate(CASES):
        kept = texts.get(i, [])
        if len(kept) != places:
            failures.append(f"{case.name}: {len(kept)} of {places} texts arrived")
        for secret in case.vanish:
            failures += [f"{case.name}: {secret!r} kept in {text!r}" for text in kept if secret in text]
            failures += [f"{case.name}: {secret!r} in the bytes of {where}" for where, blob in blobs.items() if secret.encode() in blob]
        for part in case.stay:
            failures += [f"{case.name}: {part!r} lost from {text!r}" for text in kept if part not in text]
    assert not failures, "\n".join(failures)


# -- the destinations -----------------------------------------------------------------------------


def test_every_secret_shape_vanishes_from_the_store_file_and_its_wal(tmp_path, monkeypatch):
    # the WAL is checkpointed into the file after 5 s idle: kept for as long as the test reads it
    monkeypatch.setattr(writer_module, "CHECKPOINT_IDLE", 3600.0)
    db = tmp_path / "s.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    record_cases()
    assert loopscope.flush()
    wal = raw_bytes(db.parent / (db.name + ".wal"))  # the rows are in the WAL, not yet in the file proper
    loopscope.shutdown()
    check(stored_texts(db), {"the .wal": wal, "the store file": raw_bytes(db)}, places=4)


@pytest.fixture
def receiver():
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


def test_every_secret_shape_vanishes_from_the_otlp_payload(tmp_path, receiver):
    loopscope.configure(tmp_path / "s.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint,
                        capture_content=True, flush_interval=0.05)
    record_cases()
    loopscope.shutdown()
    assert receiver.wait_for(lambda r: sum(s.name == "execute_tool echo" for s in r.spans) == len(CASES))
    texts: dict[int, list[str]] = {}
    for span in receiver.spans:
        session = span.attributes.get("gen_ai.conversation.id", "")
        if not session.startswith("case-"):
            continue
        i = int(session.split("-")[1])
        if span.name == "invoke_agent sec":
            texts.setdefault(i, []).append(span.attributes["loopscope.turn.input"])
        elif span.name == "execute_tool echo":
            texts.setdefault(i, []).append(json.loads(span.attributes["gen_ai.tool.call.arguments"])["text"])
            texts.setdefault(i, []).append(json.loads(span.attributes["gen_ai.tool.call.result"]))  # a JSON string
    payload = json.dumps([s.attributes for s in receiver.spans + receiver.pending]).encode()
    check(texts, {"the OTLP payload": payload}, places=3)


def test_every_secret_shape_vanishes_from_a_collector_and_its_raw_spans(tmp_path):
    local = tmp_path / "local.duckdb"
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=True, flush_interval=0.05)
        record_cases()
        loopscope.shutdown()
    collected = Path(collector.db)
    with open_store(str(collected), read_only=True) as con:
        raw = "\n".join(row[0] for row in con.execute("SELECT attributes::VARCHAR FROM spans").fetchall())
    blobs = {"the collector's file": raw_bytes(collected), "its raw spans table": raw.encode()}
    check(stored_texts(collected), blobs, places=4)


# -- the table itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SECRET_SHAPES, ids=[s.name for s in SECRET_SHAPES])
def test_each_documented_shape_masks_its_example_as_documented(shape):
    policy = ContentPolicy()
    assert policy.mask(shape.example) == shape.masked
    assert policy.mask(shape.masked) == shape.masked  # masking twice changes nothing
    # the store's writer looks at the example: its prefilter picks it
    assert pc.match_substring_regex(pa.array([shape.example]), pattern=prefilter(policy))[0].as_py()


def test_each_default_patterns_prefilter_matches_wherever_the_pattern_does():
    """The store's fast path stays a superset: over every text of the cases and the table,
    a value one default pattern matches is picked by that pattern's RE2 prefilter alone."""
    texts = [c.text for c in CASES] + [s.example for s in SECRET_SHAPES]
    texts += [json.dumps(t) for t in texts]  # as they travel inside JSON
    for pattern, prefilter_re2 in DEFAULT_PREFILTERS.items():
        compiled = re.compile(pattern)
        matched = [t for t in texts if compiled.search(t)]
        assert matched, f"no case exercises {pattern!r}"
        picked = pc.match_substring_regex(pa.array(matched), pattern="(?i)" + prefilter_re2).to_pylist()
        assert all(picked), [t for t, p in zip(matched, picked) if not p]


def test_a_user_pattern_may_mask_only_its_secret_group(tmp_path):
    db = tmp_path / "s.duckdb"
    policy = ContentPolicy(patterns=[r"ticket (?P<secret>[A-Z]{3}-[0-9]{4})", r"pin=(?P<secret>[0-9]{4})"], key_values=False)
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05, content_policy=policy)
    with loopscope.turn(session_id="u", input="ticket ABC-1234 with pin=9876") as t:
        t.generation("ok", finish_reason="stop")
    loopscope.shutdown()
    with open_store(str(db.resolve()), read_only=True) as con:
        body = json.loads(con.execute("SELECT content::VARCHAR FROM events WHERE session_id = 'u' ORDER BY idx").fetchone()[0])["body"]
    assert body == "ticket [REDACTED] with pin=[REDACTED]"


def test_masked_json_stays_json_with_the_headers_of_a_request(tmp_path):
    """A tool result holding request headers as JSON keeps its shape; only values go."""
    db = tmp_path / "s.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    headers: dict[str, Any] = {"Authorization": "Basic QkFTSUNzZWNyZXQ=", "Cookie": "sid=c00k1e; theme=dark",
                               "X-Api-Key": ["k1SECRET", "k2SECRET"], "Accept": "*/*", "x-request-token-count": 3}

    @loopscope.tool
    def request(url: str) -> dict[str, Any]:
        return {"url": url, "headers": headers}

    with loopscope.turn(session_id="h") as t:
        t.generation("go", tool_calls=[{"id": "r", "name": "request", "arguments": {"url": "https://u:pw1234@api.test/x"}}])
        request("https://u:pw1234@api.test/x")
        t.generation("done", finish_reason="stop")
    loopscope.shutdown()
    with open_store(str(db.resolve()), read_only=True) as con:
        end = json.loads(con.execute("SELECT content::VARCHAR FROM events WHERE session_id = 'h' AND type = 'tool_call_end'").fetchone()[0])
    assert end["arguments"] == {"url": "https://[REDACTED]@api.test/x"}
    assert end["result"] == {"url": "https://[REDACTED]@api.test/x", "headers": {
        "Authorization": "Basic [REDACTED]", "Cookie": "[REDACTED]", "X-Api-Key": ["[REDACTED]", "[REDACTED]"],
        "Accept": "*/*", "x-request-token-count": 3}}


def test_a_foreign_senders_secrets_vanish_from_the_collectors_raw_spans(tmp_path):
    """A sender other than loopscope (here the OpenTelemetry SDK's own OTLP exporter, with
    no content policy) sends its attributes unmasked: the collector masks them in the raw
    ``spans`` table as in its events (any attribute, a span event's, the status)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Status, StatusCode

    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.http_endpoint + "/v1/traces")))
        tracer = provider.get_tracer("foreign")
        for i, case in enumerate(CASES):
            with tracer.start_as_current_span(f"execute_tool echo{i}") as span:
                span.set_attributes({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "echo", "gen_ai.tool.call.id": f"f{i}",
                                     "gen_ai.tool.call.arguments": json.dumps({"text": case.text}), "gen_ai.tool.call.result": case.text,
                                     "http.request.header.note": case.text})
                span.add_event("exception", {"exception.type": "RuntimeError", "exception.message": case.text})
                span.set_status(Status(StatusCode.ERROR, case.text))
        provider.shutdown()
    collected = Path(collector.db)
    with open_store(str(collected), read_only=True) as con:
        rows = con.execute("SELECT name, attributes::VARCHAR, events::VARCHAR, status_message FROM spans").fetchall()
    texts: dict[int, list[str]] = {}
    for name, attributes, events, status in rows:
        attributes, events = json.loads(attributes), json.loads(events)
        texts[int(name.removeprefix("execute_tool echo"))] = [
            json.loads(attributes["gen_ai.tool.call.arguments"])["text"], attributes["gen_ai.tool.call.result"],
            attributes["http.request.header.note"], events[0]["attributes"]["exception.message"], status,
        ]
    check(texts, {"the collector's file": raw_bytes(collected)}, places=5)


_FRAGMENTS = (
    "password", "PassWord", "token", "tokens", "_", "-", "api", "key", "Key", "secret", "access", "account", "x-amz-signature",
    "signature", "sig", "authorization", "cookie", "Set-", "bearer", "Basic", "=", ":", " ", "\n", "\t", '"', "'", "\\", '\\"',
    "?", "&", ";", ",", "}", "]", "{", "[", "://", "@", "u", "pw", "abcdefgh12", "AKIA", "IOSFODNN7EXAMPLE", "eyJ",
    "abcdefghij", ".", "-----BEGIN ", "RSA ", "PRIVATE KEY-----", "-----END ", "sk-", "0123456789abcdef", "[REDACTED]",
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join))
def test_the_stores_prefilter_picks_every_value_the_policy_would_change(text):
    """The fast path's promise, on text made of the pieces secrets are made of: whatever
    the default policy masks (as text or inside JSON), the RE2 prefilter picks."""
    policy = ContentPolicy()
    for value in (text, json.dumps(text), json.dumps({"v": json.dumps(text)})):
        if policy.scrub_json(value, "", 0) != value:
            assert pc.match_substring_regex(pa.array([value]), pattern=prefilter(policy))[0].as_py(), value
