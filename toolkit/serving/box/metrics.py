"""``/metrics`` of the serving ports: the Prometheus text parse, the series selection, a scraper
thread, and the wait for idle servers."""

from __future__ import annotations

import re
import time
import urllib.error

from .http import http_get
from .sampler import BackgroundSampler

#: Scraped metrics: name -> how 0.5.23's series combine into one number (docs/benchmarking.md).
#: ``scheduler-sum``/``scheduler-max``: a scheduler gauge. Its total is the series without a
#: ``priority`` label or with ``priority=""`` (``--enable-priority-scheduling`` adds one series per
#: priority beside it, a breakdown of the same requests). Each DP group reports it from its
#: stats-logging rank (the lowest ``pp_rank``/``tp_rank`` of the group);
#: ``--enable-metrics-for-all-schedulers`` adds one copy per other rank, which runs the same batch.
#: So: per ``dp_rank`` the lowest rank's series, then summed (or the max) over the DP groups.
#: ``partition-sum``: a tokenizer counter, split by ``is_streaming``/``priority``: every request
#: is in exactly one series, so the series add up.
#: ``scheduler-mean``: a scheduler gauge averaged over the DP groups (the acceptance length).
#: ``spec_verify_calls_total``: the tokenizer's count of speculative verify passes, each finished
#: request's own passes added when it finishes (only with speculative decoding).
METRICS = {"sglang:num_running_reqs": "scheduler-sum", "sglang:num_queue_reqs": "scheduler-sum",
           "sglang:gen_throughput": "scheduler-sum", "sglang:token_usage": "scheduler-max",
           "sglang:generation_tokens_total": "partition-sum", "sglang:prompt_tokens_total": "partition-sum",
           "sglang:num_requests_total": "partition-sum", "sglang:spec_accept_length": "scheduler-mean",
           "sglang:realtime_tokens_total": "scheduler-sum", "sglang:cuda_graph_passes_total": "scheduler-sum",
           "sglang:http_requests_total": "partition-sum", "sglang:spec_verify_calls_total": "partition-sum"}
#: The routes a generation request arrives on (``http_requests_total`` counts every route, the
#: scrapes of ``/metrics`` too).
GENERATION_ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
#: Scheduler counters split by one label: short name -> (metric, label, the label values summed).
#: ``realtime_tokens_total`` grows every forward pass (mode decode: tokens generated; mode
#: prefill_compute: prompt tokens computed); ``cuda_graph_passes_total`` counts forward passes.
#: A mode never seen yet has no series (prometheus_client writes a labelled child only once it is
#: used): with other series of the metric present, that mode's count is 0.
SPLIT = {"decode_tokens_total": ("sglang:realtime_tokens_total", "mode", ("decode",)),
         "prefill_tokens_total": ("sglang:realtime_tokens_total", "mode", ("prefill_compute",)),
         "prefill_cached_tokens_total": ("sglang:realtime_tokens_total", "mode", ("prefill_cache",)),
         "decode_passes_total": ("sglang:cuda_graph_passes_total", "mode", ("decode_cuda_graph", "decode_none")),
         # SGLang's HTTP middleware counts each request as it arrives: requests started.
         "requests_started_total": ("sglang:http_requests_total", "endpoint", GENERATION_ENDPOINTS)}
#: Counters: each only grows while the server runs (``dsv4kit.bench.conservation`` checks it).
COUNTERS = ("decode_tokens_total", "prefill_tokens_total", "prefill_cached_tokens_total", "decode_passes_total",
            "requests_started_total", "num_requests_total", "generation_tokens_total", "prompt_tokens_total",
            "spec_verify_calls_total")
#: Metrics a point can do without: their absence is no problem (a server without speculative
#: decoding has no acceptance length; the split counters are named under their short names).
OPTIONAL = ("spec_accept_length", "realtime_tokens_total", "cuda_graph_passes_total", "http_requests_total",
            "spec_verify_calls_total")
#: Metrics a point cannot do without: a problem with one of these is named in the gate it feeds.
REQUIRED = ("num_running_reqs", "num_queue_reqs")
_RANK_LABELS = ("pp_rank", "tp_rank")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,)?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class ExpositionError(ValueError):
    """A line of /metrics that is not Prometheus text format."""


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def _number(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return float("inf")
    if lowered == "-inf":
        return float("-inf")
    if lowered == "nan":
        return float("nan")
    return float(text)


def parse_exposition(text: str, names=None) -> list:
    """Prometheus text format 0.0.4 -> [(name, {label: value}, float)], in order; only ``names``
    when given. Comments and blank lines are skipped; label values are unescaped; a trailing
    timestamp is dropped. Checked against prometheus_client's parser in the tests."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        if not match:
            raise ExpositionError(f"line {number}: no metric name: {line[:80]!r}")
        name, rest = match.group(0), line[match.end():]
        labels = {}
        if rest.startswith("{"):
            pos = 1
            while True:
                while pos < len(rest) and rest[pos] == " ":
                    pos += 1
                if pos < len(rest) and rest[pos] == "}":
                    pos += 1
                    break
                label = _LABEL.match(rest, pos)
                if not label:
                    raise ExpositionError(f"line {number}: bad label set: {line[:120]!r}")
                labels[label.group(1)] = _unescape(label.group(2))
                pos = label.end()
                if not label.group(3) and not rest[pos:pos + 1] == "}":
                    raise ExpositionError(f"line {number}: bad label set: {line[:120]!r}")
            rest = rest[pos:]
        fields = rest.split()
        if not fields or len(fields) > 2:
            raise ExpositionError(f"line {number}: expected a value (and a timestamp): {line[:120]!r}")
        try:
            value = _number(fields[0])
        except ValueError:
            raise ExpositionError(f"line {number}: value {fields[0]!r} is not a number") from None
        if names is None or name in names:
            out.append((name, labels, value))
    return out


def _rank(labels: dict) -> tuple:
    def as_int(text):
        try:
            return int(text)
        except (TypeError, ValueError):
            return -1
    return tuple(as_int(labels.get(name)) for name in _RANK_LABELS)


def _shape(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def select_metric(name: str, series: list) -> tuple:
    """(value, problem) of one metric from its series [(labels, value)] (see METRICS); value None
    with the problem in words when the series is missing or ambiguous."""
    how = METRICS[name]
    if not series:
        return None, f"{name} is missing from /metrics"
    if how == "partition-sum":
        return sum(v for _, v in series), None
    totals = [(l, v) for l, v in series if l.get("priority", "") == ""]
    if not totals:
        return None, (f"{name} has only per-priority series ({len(series)}), no total (priority=\"\"): "
                      f"the total cannot be told")
    groups: dict = {}
    for labels, value in totals:
        groups.setdefault(labels.get("dp_rank"), []).append((labels, value))
    values = []
    for dp, members in sorted(groups.items(), key=lambda item: str(item[0])):
        lowest = min(_rank(l) for l, _ in members)
        chosen = [(l, v) for l, v in members if _rank(l) == lowest]
        if len(chosen) > 1:
            return None, (f"{name} is ambiguous: {len(chosen)} total series for the same rank"
                          f"{'' if dp is None else f' of dp_rank {dp}'}, differing in other labels: "
                          + "; ".join(_shape(l) for l, _ in chosen[:4]))
        values.append(chosen[0][1])
    if how == "scheduler-mean":
        return sum(values) / len(values), None
    return (max(values) if how == "scheduler-max" else sum(values)), None


def select_metrics(samples: list) -> tuple:
    """The parsed exposition -> ({short name: value}, {short name: problem}) for METRICS."""
    by_name: dict = {name: [] for name in METRICS}
    for name, labels, value in samples:
        if name in by_name:
            by_name[name].append((labels, value))
    values, problems = {}, {}
    for name, series in by_name.items():
        short = name.split(":", 1)[1]
        if short in OPTIONAL and not series:
            continue
        if name in {metric for metric, _, _ in SPLIT.values()}:
            continue  # only its split values below mean something
        value, problem = select_metric(name, series)
        if problem:
            problems[short] = problem
        else:
            values[short] = value
    for short, (name, label, wanted) in SPLIT.items():
        series = by_name[name]
        if not series:
            continue  # the server does not have this counter (an older SGLang, or metrics off)
        total, problem = 0.0, None
        for mode in wanted:
            part = [({k: v for k, v in l.items() if k != label}, v) for l, v in series if l.get(label) == mode]
            if part:
                value, problem = select_metric(name, part)
                if problem:
                    break
                total += value
        if problem:
            problems[short] = f"{problem} ({label}={'/'.join(wanted)})"
        else:
            values[short] = total
    return values, problems


def read_metrics(port: int) -> tuple:
    """({short name: value}, {short name: problem}, raw text of our metrics' lines) of one scrape."""
    _, body = http_get(port, "/metrics", 5.0)
    samples = parse_exposition(body, names=METRICS)
    kept = "\n".join(l for l in body.splitlines() if l.split("{", 1)[0].split(" ", 1)[0] in METRICS) + "\n"
    values, problems = select_metrics(samples)
    return values, problems, kept


class Scraper(BackgroundSampler):
    """Poll ``/metrics`` of some ports in a thread until stopped. Each sample has ``t`` (the box's
    monotonic clock, which placing the window uses), ``wall`` (its wall clock, for people), the
    port, the selected values and, when a metric could not be selected, ``problems``."""

    sample_at_start = True
    sample_at_exit = True  # one scrape after the client is done: the run's closing edge

    def __init__(self, ports, interval: float):
        super().__init__(interval)
        self.ports = ports
        self.samples: list = []
        self.errors: dict = {}
        self.exposition: dict = {}  # port -> the raw text of our metrics in its first scrape

    def scrape(self, port) -> None:
        try:
            values, problems, raw = read_metrics(port)
        except urllib.error.HTTPError as exc:
            self._error(port, f"HTTP {exc.code} from /metrics (is the server started with --enable-metrics?)")
            return
        except ExpositionError as exc:
            self._error(port, f"/metrics is not Prometheus text: {exc}")
            return
        except Exception as exc:
            self._error(port, str(getattr(exc, "reason", exc)))
            return
        if not values:
            self._error(port, "no sglang: metrics in the answer (is the server started with --enable-metrics?)")
            return
        self.exposition.setdefault(str(port), raw)
        sample = {"t": round(time.monotonic(), 4), "wall": round(time.time(), 4), "port": port, **values}
        if problems:
            sample["problems"] = problems
        self.samples.append(sample)

    def sample(self) -> None:
        for port in self.ports:
            self.scrape(port)

    def _error(self, port, message: str) -> None:
        entry = self.errors.setdefault(str(port), {"count": 0, "first": message})
        entry["count"] += 1


def wait_idle(ports, timeout: float, interval: float = 0.5, still: bool = False) -> dict:
    """Wait until every port's server runs and queues no request (``num_running_reqs`` and
    ``num_queue_reqs`` 0), at most ``timeout`` s; with ``still``, also until no counter
    (``COUNTERS``) moved since the previous read, ``interval`` s before (the gauges may be up to
    40 decode passes old; the counters are not). ``{"ok", "waited_s", "ports": {port: last
    values or problem}}``; not ok names the load (or why it could not be read)."""
    started = time.monotonic()
    previous: dict = {}
    while True:
        seen, busy, blind = {}, [], []
        for port in ports:
            try:
                values, problems, _ = read_metrics(port)
            except Exception as exc:
                seen[str(port)] = {"error": str(getattr(exc, "reason", exc))}
                blind.append(f"port {port}: /metrics unreadable ({seen[str(port)]['error']})")
                continue
            wanted = {k: values.get(k) for k in REQUIRED}
            seen[str(port)] = {**wanted, **({"problems": problems} if problems else {})}
            missing = [problems.get(k) or f"{k} missing" for k in REQUIRED if values.get(k) is None]
            if missing:
                blind.append(f"port {port}: " + "; ".join(missing))
            elif wanted["num_running_reqs"] or wanted["num_queue_reqs"]:
                busy.append(f"port {port}: {wanted['num_running_reqs']:g} running, {wanted['num_queue_reqs']:g} "
                            f"queued")
            if still:
                counters = {k: values.get(k) for k in COUNTERS if values.get(k) is not None}
                before = previous.get(port)
                moved = ["first read"] if before is None else [
                    f"{k} {before.get(k)} -> {v:g}" for k, v in counters.items() if before.get(k) != v]
                previous[port] = counters
                if moved:
                    busy.append(f"port {port}: counters moving ({', '.join(moved[:3])})")
        waited = round(time.monotonic() - started, 2)
        if blind:  # waiting cannot help: the load cannot be read at all
            return {"ok": False, "waited_s": waited, "ports": seen,
                    "detail": "cannot tell whether the servers are idle before the point: " + "; ".join(blind)}
        if not busy:
            return {"ok": True, "waited_s": waited, "ports": seen}
        if waited >= timeout:
            return {"ok": False, "waited_s": waited, "ports": seen,
                    "detail": f"the servers were not idle before the point (another client's load?) after "
                              f"{timeout:g} s: " + "; ".join(busy)}
        time.sleep(interval)

