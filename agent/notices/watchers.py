"""A cloud's set of watchers, built and started together, and which cloud a
node is on (as set, or detected by probing the metadata services)."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from spotbroker.agent.notices import aws, azure, gcp
from spotbroker.agent.notices.aws import AwsWatcher, ImdsToken
from spotbroker.agent.notices.azure import AzureWatcher
from spotbroker.agent.notices.gcp import GcpWatcher
from spotbroker.agent.notices.watcher import MetadataError, Notice, WatchConfig, Watcher, metadata_client

CLOUDS = ("aws", "gcp", "azure")
DEFAULT_METADATA_URLS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}


class Watchers:
    """All the watchers of one cloud, started and stopped together."""

    def __init__(self, cloud: str, watchers: list[Watcher], token: ImdsToken | None = None) -> None:
        self.cloud = cloud
        self.watchers = watchers
        self._token = token

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.request_stop()  # all at once; a thread in a long poll ends on its own (daemon)
        for watcher in self.watchers:
            watcher.stop(join_timeout=0.05)
        if self._token is not None:
            self._token.close()

    def acknowledge(self, notice: Notice) -> bool:
        """Acknowledge a notice where the cloud wants it (Azure); False where none is needed."""
        for watcher in self.watchers:
            if isinstance(watcher, AzureWatcher) and notice.event_id and notice.source == watcher.name:
                return watcher.acknowledge(notice.event_id)
        return False


def build_watchers(cloud: str, on_notice: Callable[[Notice], None], base_url: str | None = None,
                   config: WatchConfig | None = None, azure_vm_name: str | None = None) -> Watchers:
    """The watchers of `cloud` against `base_url` (default: the cloud's own endpoint)."""
    config = config or WatchConfig()
    url = (base_url or DEFAULT_METADATA_URLS[cloud]).rstrip("/")
    if cloud == "aws":
        token = ImdsToken(url, config)
        paths = (aws.AWS_INSTANCE_ACTION, aws.AWS_REBALANCE)
        return Watchers(cloud, [AwsWatcher(p, token, url, on_notice, config) for p in paths], token)
    if cloud == "gcp":
        keys = ("instance/preempted", "instance/maintenance-event")
        return Watchers(cloud, [GcpWatcher(k, url, on_notice, config) for k in keys])
    if cloud == "azure":
        return Watchers(cloud, [AzureWatcher(url, on_notice, config, azure_vm_name)])
    raise ValueError(f"no notice watchers for cloud {cloud!r} (one of {', '.join(CLOUDS)})")


_PROBES: dict[str, Callable[[httpx.Client], bool]] = {"aws": aws.probe, "gcp": gcp.probe, "azure": azure.probe}


def detect_cloud(metadata_url: str | None = None, timeout: float = 1.0) -> str | None:
    """Which cloud's metadata service answers (all probed at once); None off-cloud."""

    def probe(cloud: str) -> bool:
        try:
            with metadata_client(metadata_url or DEFAULT_METADATA_URLS[cloud], timeout) as client:
                return _PROBES[cloud](client)
        except (httpx.HTTPError, MetadataError, ValueError):
            return False

    with ThreadPoolExecutor(max_workers=len(CLOUDS), thread_name_prefix="detect-cloud") as pool:
        found = dict(zip(CLOUDS, pool.map(probe, CLOUDS)))
    return next((cloud for cloud in CLOUDS if found[cloud]), None)


def resolve_cloud(setting: str | None, metadata_url: str | None, timeout: float = 1.0) -> str | None:
    """The cloud to watch: as set (`SPOTBROKER_CLOUD`), else detected.

    `local` means no cloud metadata service, unless a metadata URL is given (the
    local launcher's simulator), in which case the simulated cloud is detected.
    `k8s` (a pod on the operator's Kubernetes cluster, never reclaimed by a
    cloud) has none either: an eviction reaches the pod as SIGTERM.
    """
    setting = (setting or "").strip().lower()
    if setting in CLOUDS:
        return setting
    if setting == "k8s" or (setting == "local" and not metadata_url):
        return None
    if setting not in ("", "local"):
        raise ValueError(f"unknown cloud {setting!r}: use aws, gcp, azure, k8s or local")
    return detect_cloud(metadata_url, timeout)
