"""Prometheus metrics, kept in a registry per app so that several apps (tests) never share counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """Every metric the service exports under `/metrics`; `graph` is `capsnet` (image -> outputs) or `decoder`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # protocol "http": route template, HTTP method and status code; protocol "grpc": the full method name
        # (/inference.GRPCInferenceService/ModelInfer), method POST and the status code's name (OK, NOT_FOUND, …).
        self.requests = Counter(
            "capsnet_http_requests",
            "Requests by protocol (http, grpc), route template (or gRPC method), method and status.",
            ["protocol", "route", "method", "status"],
            registry=r,
        )
        self.request_latency = Histogram(
            "capsnet_http_request_duration_seconds",
            "Time from request start to response end, by protocol and route template (or gRPC method).",
            ["protocol", "route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.connections_refused = Counter(
            "capsnet_http_connections_refused",
            "HTTP connections answered and closed by the server itself (service.api.connection), by reason: "
            "too_many_connections, header_too_large, too_many_headers, head_timeout, body_timeout, invalid_request.",
            ["reason"],
            registry=r,
        )
        self.queue_time = Histogram(
            "capsnet_queue_seconds",
            "Time a request waited for its batch to start.",
            ["model", "version", "graph"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_time = Histogram(
            "capsnet_compute_seconds",
            "ONNX Runtime run time per batch.",
            ["model", "version", "graph"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "capsnet_batch_size",
            "Rows (images) per ONNX Runtime run.",
            ["model", "version", "graph"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        versioned = ["model", "version", "graph"]
        self.queue_depth = Gauge("capsnet_queue_depth", "Requests waiting for a batch.", versioned, registry=r)
        self.inferences = Counter("capsnet_inferences", "Rows (images) inferred.", versioned, registry=r)
        self.runs = Counter(
            "capsnet_runs",
            "ONNX Runtime runs by lane: wide (every intra-op thread, a lone batch) or narrow (one thread, under load).",
            ["model", "version", "graph", "lane"],
            registry=r,
        )
        self.models_loaded = Gauge("capsnet_models_loaded", "Models loaded, warmed up and ready.", registry=r)
        self.model_ready = Gauge(
            "capsnet_model_ready", "1 when the model version is ready, else 0.", ["model", "version"], registry=r
        )
        self.provider = Gauge(
            "capsnet_execution_provider_info",
            "The ONNX Runtime execution provider each model version runs on (value 1).",
            ["model", "version", "provider"],
            registry=r,
        )
        # Lifecycle (service.runtime.registry): every load attempt, its outcome and duration, every unload.
        self.model_loads = Counter(
            "capsnet_model_loads",
            "Model version loads by outcome: ready, or failed (the version serving before, if any, keeps serving).",
            ["model", "outcome"],
            registry=r,
        )
        self.model_unloads = Counter(
            "capsnet_model_unloads", "Model versions drained and released.", ["model"], registry=r
        )
        self.model_load_time = Histogram(
            "capsnet_model_load_seconds",
            "Time to read, verify, load and warm up a model version (successful loads).",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
