"""What a model call cost, in USD: `genai-prices`' dated price database, and the user's overrides.

Used by the span mapping where a ``model_calls`` row (and a turn summary) is made, in the
store writer's thread: :func:`price` is called once per model call, so it is cheap. For
each provider, model and UTC day the price is looked up in genai-prices once and reduced
to four rates (USD per token of uncached input, cache read, cache write and output),
found by asking genai-prices itself what a million tokens of each cost, so its rules
(fallbacks for missing cache prices included) are followed exactly; a model with tiered
prices (the rate depends on the prompt's size) is asked per call. Token counts are the
normalized ones: input includes cached tokens, as genai-prices expects.

genai-prices' bundled snapshot is used as installed: nothing here ever fetches prices
(its ``UpdatePrices`` is never started), so a store's costs do not depend on the network.

An unknown model (or a provider genai-prices does not know) costs None: counted by the
views as a call without a price, never guessed. A call is priced as the model that
answered it (the response's model), the requested one only when the response named none.

Which provider's prices apply follows the server the call went to (``server.address``):
:data:`SERVER_PROVIDERS`, a small table of the providers' own hosts, or the user's
``providers`` table (below); a server in neither (a local or self-hosted one, a gateway)
leaves the call unpriced, whatever the SDK's provider (an OpenAI-compatible server answering
as ``gpt-4o`` is not OpenAI). A span without a server keeps its own provider. Adapters
record the provider the table names as ``gen_ai.provider.name`` (:func:`provider_of`).
Server-tool fees (Anthropic's web searches) are added to the tokens' price.
Overrides, for custom or self-hosted models, win over genai-prices: per model name, USD
per million tokens of ``input``, ``output``, ``cache_read`` and ``cache_write`` (the
cache prices default to the input price). They come from ``configure(prices=...)``
(:func:`set_overrides`) and from a TOML or JSON file named by ``LOOPSCOPE_PRICES`` (or
``loopscope collect --prices FILE``); ``configure``'s entries win over the file's. The
same tables may hold ``providers``: server host (or ``host:port``) -> the provider it stands
for (a ``gen_ai.provider.name``, or :data:`SAME_AS_SDK` for a gateway that forwards each
SDK's calls to that SDK's own provider); prices are then that provider's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._guard import internal_error, warn_once

__all__ = [
    "PRICES_ENV",
    "SAME_AS_SDK",
    "SERVER_PROVIDERS",
    "PriceOverride",
    "PricesError",
    "load_prices",
    "price",
    "provider_of",
    "set_overrides",
    "use_prices_file",
]

PRICES_ENV = "LOOPSCOPE_PRICES"
"""Environment variable: a TOML or JSON file of price overrides (see :func:`load_prices`)."""

SOURCE_DATABASE, SOURCE_OVERRIDE = "genai-prices", "override"
"""The ``price_source`` of a priced call: genai-prices' database, or the user's overrides."""

PriceOverride = Mapping[str, float]
"""One model's prices: USD per million tokens of ``input``, ``output``, and optionally
``cache_read`` and ``cache_write`` (default: the input price)."""

_KEYS = ("input", "output", "cache_read", "cache_write")


class PricesError(ValueError):
    """Price overrides that are not prices (a file or ``configure(prices=...)``)."""


# gen_ai.provider.name values whose genai-prices provider id differs
_PROVIDER_IDS = {
    "gcp.gemini": "google", "gcp.vertex_ai": "google", "gcp.gen_ai": "google", "google": "google",
    "aws.bedrock": "aws", "azure.ai.openai": "azure", "azure.ai.inference": "azure",
    "x_ai": "x-ai", "xai": "x-ai", "mistral_ai": "mistral", "ibm.watsonx.ai": "ibm",
}

SERVER_PROVIDERS = {
    "api.openai.com": "openai",
    "openai.azure.com": "azure.ai.openai",
    "cognitiveservices.azure.com": "azure.ai.openai",
    "services.ai.azure.com": "azure.ai.openai",
    "api.anthropic.com": "anthropic",
    "api.groq.com": "groq",
    "generativelanguage.googleapis.com": "gcp.gemini",
    "aiplatform.googleapis.com": "gcp.vertex_ai",
    "api.mistral.ai": "mistral_ai",
    "openrouter.ai": "openrouter",
    "api.deepseek.com": "deepseek",
    "api.together.xyz": "together",
    "api.together.ai": "together",
    "api.fireworks.ai": "fireworks",
    "api.x.ai": "x_ai",
    "api.perplexity.ai": "perplexity",
    "api.cerebras.ai": "cerebras",
    "api.moonshot.ai": "moonshotai",
    "api.moonshot.cn": "moonshotai",
    "api.cohere.ai": "cohere",  # its OpenAI-compatible API, /compatibility/v1
    "api.cohere.com": "cohere",
    "api.novita.ai": "novita",
    "api.z.ai": "zai",
    "open.bigmodel.cn": "zhipuai",
    "api.minimax.io": "minimax",
    "api.minimaxi.com": "minimax",
    "inference.baseten.co": "baseten",
    "api.sambanova.ai": "sambanova",
    "api.deepinfra.com": "deepinfra",
    "api.hyperbolic.xyz": "hyperbolic",
    "api.studio.nebius.com": "nebius",
    "integrate.api.nvidia.com": "nvidia",
    "localhost:11434": "ollama",  # Ollama's own port (its OpenAI-compatible /v1 too)
    "127.0.0.1:11434": "ollama",
}
"""The providers' own API hosts -> their ``gen_ai.provider.name``: a host matches an entry
equal to it or ending in ``.entry`` (``myres.openai.azure.com``) or ``-entry``
(``us-east5-aiplatform.googleapis.com``); an entry with a port (``localhost:11434``,
Ollama's) matches that host and port only. A provider genai-prices does not know (Ollama's,
a local one) leaves its calls unpriced. Kept in docs/model-calls.md."""

REGIONAL_HOSTS = (("bedrock-runtime", ".amazonaws.com", "aws.bedrock"), ("bedrock-runtime", ".amazonaws.com.cn", "aws.bedrock"))
"""Providers whose API host names a region between a service and a domain the provider
shares with its other services (``bedrock-runtime.us-east-1.amazonaws.com``, its FIPS twin
``bedrock-runtime-fips.us-east-1.amazonaws.com``): (service, domain, provider). Kept in docs/model-calls.md."""

SAME_AS_SDK = "sdk"
"""A ``providers`` value: the server stands for the provider of the SDK that calls it (a
gateway that forwards OpenAI calls to OpenAI and Anthropic calls to Anthropic)."""

_DAY_US = 86_400_000_000

# -- overrides ------------------------------------------------------------------------------

_configured: dict[str, tuple[float, float, float, float]] = {}
_from_file: dict[str, tuple[float, float, float, float]] | None = None  # None: not read yet
_file_path: str | None = None
_configured_servers: dict[str, str] = {}
_file_servers: dict[str, str] = {}


def _rates(name: str, entry: Any) -> tuple[float, float, float, float]:
    if not isinstance(entry, Mapping):
        raise PricesError(f"prices for {name!r}: expected a table of USD per million tokens, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise PricesError(f"prices for {name!r}: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(_KEYS)})")
    values: dict[str, float] = {}
    for key in _KEYS:
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise PricesError(f"prices for {name!r}: {key} must be a non-negative number (USD per million tokens)")
        values[key] = float(value)
    if "input" not in values or "output" not in values:
        raise PricesError(f"prices for {name!r}: input and output are required (USD per million tokens)")
    per = 1e-6
    return (
        values["input"] * per, values.get("cache_read", values["input"]) * per,
        values.get("cache_write", values["input"]) * per, values["output"] * per,
    )


_PROVIDERS_KEY = "providers"


def _models(prices: Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(prices.get("models"), Mapping):
        return prices["models"]
    return {name: entry for name, entry in prices.items() if name != _PROVIDERS_KEY}


def _parsed(prices: Mapping[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    return {str(name).lower(): _rates(str(name), entry) for name, entry in _models(prices).items()}


def _servers(prices: Mapping[str, Any]) -> dict[str, str]:
    """The ``providers`` table: server host (or ``host:port``) -> a provider name."""
    table = prices.get(_PROVIDERS_KEY)
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise PricesError(f"providers: expected a table of server -> provider name, got {type(table).__name__}")
    out = {}
    for server, name in table.items():
        if not isinstance(server, str) or not server or not isinstance(name, str) or not name:
            raise PricesError(f"providers: {server!r} = {name!r}: a server (host or host:port) names a provider")
        out[server.lower()] = name
    return out


def set_overrides(prices: Mapping[str, Mapping[str, Any]] | None) -> None:
    """Set the prices of models by name (``configure(prices=...)``): ``{"my-llama":
    {"input": 0.2, "output": 0.6}}`` in USD per million tokens. They win over
    genai-prices and over the file's; None or ``{}`` removes them. A ``providers`` table
    names the provider servers stand for (``{"providers": {"127.0.0.1:8000": "groq"}}``).
    Raises :class:`PricesError` (a ValueError) for an entry that is not prices."""
    global _configured, _configured_servers
    parsed, servers = _parsed(prices or {}), _servers(prices or {})
    _configured, _configured_servers = parsed, servers
    _cache.clear()
    _server_cache.clear()


def load_prices(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a prices file: TOML (``.toml``) or JSON, a table per model name (optionally
    under ``models``) with ``input``, ``output``, ``cache_read``, ``cache_write`` in USD
    per million tokens, and optionally a ``providers`` table (server -> provider). Raises OSError, or ValueError for text that is not TOML / JSON
    or tables that are not prices (:class:`PricesError`)."""
    text = Path(path).read_text(encoding="utf-8")
    data: Any
    if str(path).endswith(".toml"):
        if sys.version_info >= (3, 11):  # a check pyright understands
            import tomllib
        else:  # tomllib is 3.11's; tomli is the same parser, from PyPI (pyproject's dependencies)
            import tomli as tomllib  # pyright: ignore[reportMissingImports] - not in a 3.11+ venv

        data = tomllib.loads(text)
    else:
        data = json.loads(text)
    if not isinstance(data, Mapping):
        raise PricesError(f"{path}: expected a table of models")
    _parsed(data)  # checked now, so that a bad file is said where it is named
    servers = _servers(data)
    found: dict[str, Any] = {str(k): dict(v) for k, v in _models(data).items()}
    if servers:
        found[_PROVIDERS_KEY] = servers
    return found


def use_prices_file(path: str | os.PathLike[str] | None) -> None:
    """Use the overrides of the prices file at ``path`` (None: the file ``LOOPSCOPE_PRICES``
    names, read at the first price). Raises what :func:`load_prices` raises."""
    global _from_file, _file_path, _file_servers
    if path is None:
        _from_file, _file_path, _file_servers = None, None, {}
    else:
        loaded = load_prices(path)
        _from_file, _file_path, _file_servers = _parsed(loaded), str(path), _servers(loaded)
    _cache.clear()
    _server_cache.clear()


def _file_overrides() -> dict[str, tuple[float, float, float, float]]:
    global _from_file, _file_path, _file_servers
    if _from_file is None:
        _from_file = {}
        path = os.environ.get(PRICES_ENV)
        if path:
            try:
                loaded = load_prices(path)
                _from_file, _file_path, _file_servers = _parsed(loaded), path, _servers(loaded)
            except (OSError, ValueError) as exc:  # PricesError, or a file that is not TOML / JSON
                warn_once(f"prices:{path}", "loopscope: the prices file %s (%s) was not read: %s", path, PRICES_ENV, exc)
    return _from_file


def _override(model: str) -> tuple[float, float, float, float] | None:
    key = model.lower()
    found = _configured.get(key)
    if found is None:
        found = _file_overrides().get(key)
    return found


# -- servers ---------------------------------------------------------------------------------

# (host, port) -> the provider the user or the table names for it, or None: unknown
_server_cache: dict[tuple[Any, Any], str | None] = {}


def _server_provider(host: str, port: Any) -> str | None:
    key = (host, port)
    try:
        return _server_cache[key]
    except KeyError:
        pass
    _file_overrides()  # the file's providers table, read once
    name = host.lower()
    found = None
    for table in (_configured_servers, _file_servers):
        found = table.get(f"{name}:{port}") if port is not None else None
        if found is None:
            found = table.get(name)
        if found is not None:
            break
    if found is None:
        address = f"{name}:{port}" if port is not None else name
        for entry, provider in SERVER_PROVIDERS.items():
            if address == entry or name == entry or (name.endswith(entry) and name[-len(entry) - 1] in ".-"):
                found = provider
                break
    if found is None:
        service = name.split(".", 1)[0].removesuffix("-fips")
        found = next((p for prefix, domain, p in REGIONAL_HOSTS if service == prefix and name.endswith(domain)), None)
    if len(_server_cache) >= 256:
        _server_cache.clear()
    _server_cache[key] = found
    return found


def provider_of(sdk_provider: str, host: Any, port: Any = None) -> str:
    """The ``gen_ai.provider.name`` of a call an SDK of ``sdk_provider`` sent to ``host``:
    the provider :data:`SERVER_PROVIDERS` or the user's ``providers`` table names, else the
    SDK's (the GenAI conventions' best knowledge; such a call is not priced). Never raises."""
    if not host or type(host) is not str:
        return sdk_provider
    try:
        found = _server_provider(host, port)
    except Exception:
        internal_error("the provider of a server")
        return sdk_provider
    return sdk_provider if found is None or found == SAME_AS_SDK else found


def _priced_as(provider: Any, host: str, port: Any) -> Any:
    """The provider whose prices apply to a call recorded with ``provider`` that went to
    ``host``; None: a server neither the table nor the user knows (no price)."""
    found = _server_provider(host, port)
    return provider if found == SAME_AS_SDK else found


# -- genai-prices ------------------------------------------------------------------------------

# (provider, model, day) -> rates, or a ModelPrice to ask per call (tiered), or None: unknown
_cache: dict[tuple[Any, str, int], Any] = {}
_CACHE_LIMIT = 4096


class _PerCall:
    """A model genai-prices prices, asked per call through its public ``calc_price``: its
    prices are tiered, or its internals are not as this module knows them."""

    __slots__ = ("model", "provider_id")

    def __init__(self, model: str, provider_id: str | None) -> None:
        self.model, self.provider_id = model, provider_id

    def calc_price(self, usage: Any, at_us: int) -> float:
        from genai_prices import calc_price

        when = datetime.fromtimestamp(at_us / 1e6, tz=timezone.utc)
        found = calc_price(usage, self.model, provider_id=self.provider_id, genai_request_timestamp=when)
        return float(found.total_price)


def _lookup(provider: str | None, model: str, at_us: int) -> Any:
    """Rates (uncached input, cache read, cache write, output; USD per token), a
    :class:`_PerCall` to ask per call, or None for a model genai-prices does not price."""
    from genai_prices import Usage, data_snapshot

    provider_id = None
    if provider:
        provider_id = _PROVIDER_IDS.get(provider, provider)
    try:
        snapshot = data_snapshot.get_snapshot()
        try:
            found_provider, found_model = snapshot.find_provider_model(model, None, provider_id, None)
        except LookupError:
            return None  # a model (or provider) genai-prices does not know: no price, never a guess
        if provider_id is not None and found_provider.id != provider_id:
            return None
        when = datetime.fromtimestamp(at_us / 1e6, tz=timezone.utc)
        model_price = found_model.get_prices(when)
        from genai_prices.types import TieredPrices

        if any(isinstance(v, TieredPrices) for v in vars(model_price).values()):
            return _PerCall(model, provider_id)
    except (AttributeError, ImportError, TypeError):  # another genai-prices than 0.2's internals
        return _PerCall(model, provider_id)

    def cost(**tokens: int) -> float:
        return float(model_price.calc_price(Usage(**tokens))["total_price"])

    million, thousand = 1_000_000, 1000
    return (
        cost(input_tokens=million, output_tokens=0) / million,
        cost(input_tokens=million, cache_read_tokens=million, output_tokens=0) / million,
        cost(input_tokens=million, cache_write_tokens=million, output_tokens=0) / million,
        cost(input_tokens=0, output_tokens=million) / million,
        cost(input_tokens=0, output_tokens=0, web_searches=thousand) / thousand,  # one web search's fee
    )


def price(
    provider: Any,
    model: Any,
    input_tokens: Any,
    output_tokens: Any,
    cache_read: Any,
    cache_write: Any,
    at_us: int,
    server_address: Any = None,
    server_port: Any = None,
    web_searches: Any = None,
) -> tuple[float | None, str | None]:
    """USD a model call cost and where its price came from (``"override"`` or
    ``"genai-prices"``); ``(None, None)`` when the model is unknown, the server is not a
    known provider's (``server_address``, see :data:`SERVER_PROVIDERS`) or the call
    reported no usage. Token counts are normalized (input includes cache read and cache
    write); missing ones count 0. ``web_searches``: server-side web searches the call ran
    (their fee is added). Never raises."""
    if not model or type(model) is not str:
        return None, None
    if type(input_tokens) is not int and type(output_tokens) is not int:
        return None, None  # no usage reported: nothing to price
    try:
        inp = input_tokens if type(input_tokens) is int else 0
        out = output_tokens if type(output_tokens) is int else 0
        read = cache_read if type(cache_read) is int else 0
        write = cache_write if type(cache_write) is int else 0
        searches = web_searches if type(web_searches) is int and web_searches > 0 else 0
        rates = _override(model)
        source = SOURCE_OVERRIDE
        if rates is None:
            if server_address and type(server_address) is str:
                provider = _priced_as(provider, server_address, server_port)
                if provider is None:
                    return None, None  # a server no table names: another provider's, or none's
            key = (provider, model, at_us // _DAY_US)
            rates = _cache.get(key, _cache)
            if rates is _cache:
                rates = _lookup(provider if type(provider) is str else None, model, at_us)
                if len(_cache) >= _CACHE_LIMIT:
                    _cache.clear()
                _cache[key] = rates
            if rates is None:
                return None, None
            source = SOURCE_DATABASE
            if type(rates) is not tuple:  # tiered prices: genai-prices per call
                from genai_prices import Usage

                usage = Usage(input_tokens=inp, output_tokens=out, cache_read_tokens=read, cache_write_tokens=write)
                if searches:
                    usage.web_searches = searches
                return rates.calc_price(usage, at_us), source
        uncached = inp - read - write
        if uncached < 0:
            return None, None  # counts that contradict each other: no price rather than a wrong one
        cost = uncached * rates[0] + read * rates[1] + write * rates[2] + out * rates[3]
        if searches:
            cost += searches * (rates[4] if len(rates) > 4 else 0.0)
        return cost, source
    except Exception:
        internal_error("model call pricing")
        return None, None
