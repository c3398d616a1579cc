"""GCP: which zones offer which machine types, from Compute Engine
(`google-cloud-compute`): the machine types with built-in GPUs per zone
(`machineTypes.aggregatedList`, each with its `accelerators`, vCPUs and
memory), kept where the zone lists that GPU among its accelerator types
(`acceleratorTypes.aggregatedList`), the N1 types with each GPU of the zone
they may carry (`gcp_n1`), and the CPU families' types per zone.

Without it (no project configured, or the Compute API refused) the GCP
source prices the bundled snapshot's machine types and zones.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from spotbroker.broker.pricing import gcp_n1
from spotbroker.broker.pricing.base import SourceUnavailable
from spotbroker.broker.pricing.cpu_families import GCP_FAMILIES, GCP_SERIES, gcp_cpu_type, gcp_family
from spotbroker.broker.pricing.normalise import QualityReport, accelerator_name

log = logging.getLogger("spotbroker.pricing")
# Only the series the Billing Catalog prices as core + RAM (+ GPU); the API
# filters by name (RE2, the whole name must match), so other types never come.
NAME_FILTER = "name eq '({})-.*'".format("|".join(sorted((*GCP_SERIES, *GCP_FAMILIES))))
PAGE_SIZE = 500  # the API's largest page


class ComputeZones:
    def __init__(self, machine_types, accelerator_types, project: str, timeout: float) -> None:
        self.machine_types, self.accelerator_types = machine_types, accelerator_types
        self.project, self.timeout = project, timeout

    @classmethod
    def build(cls, credentials, project: str, endpoint: str | None, timeout: float) -> ComputeZones:
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        options = ClientOptions(api_endpoint=endpoint) if endpoint else None
        kwargs: dict[str, Any] = {"credentials": credentials, "transport": "rest", "client_options": options}
        return cls(compute_v1.MachineTypesClient(**kwargs), compute_v1.AcceleratorTypesClient(**kwargs),
                   project, timeout)

    def machines(self, report: QualityReport) -> list:
        """The GPU and CPU machine types in every zone that offers them (as `gcp.Machine`s)."""
        from spotbroker.broker.pricing.gcp import Machine

        # The raw protobuf messages (`type(x).pb(x)`): proto-plus's attribute
        # access cost more than the parsing over a few thousand machine types.
        offered = {(zone, t.name) for zone, scoped in self._pages(self.accelerator_types, None)
                   for t in type(scoped).pb(scoped).accelerator_types}
        attachable: dict[str, list[str]] = {}
        for zone, accelerator in sorted(offered):
            if (name := accelerator_name(accelerator)) in gcp_n1.SIZES:
                attachable.setdefault(zone, []).append(name)
        out = []
        for zone, scoped in self._pages(self.machine_types, NAME_FILTER):
            for m in type(scoped).pb(scoped).machine_types:
                if not m.accelerators and gcp_cpu_type(m.name) and m.guest_cpus > 0:
                    out.append(Machine(m.name, gcp_family(m.name), zone.rsplit("-", 1)[0], zone, float(m.guest_cpus),
                                       round(m.memory_mb / 1024, 3), None, 0))
                    continue
                if gcp_n1.is_host(m.name) and m.guest_cpus > 0:
                    out += _with_attached(m, zone, attachable.get(zone, ()))
                    continue
                series = next((s for s in GCP_SERIES if m.name.startswith(s + "-")), None)
                if series is None or not m.accelerators:
                    continue  # not a GPU machine the Billing Catalog prices by parts
                gpu = m.accelerators[0]
                name = accelerator_name(gpu.guest_accelerator_type)
                if (zone, gpu.guest_accelerator_type) not in offered:
                    report.note("GPU not offered in the zone")
                    continue
                if not name or gpu.guest_accelerator_count <= 0 or m.guest_cpus <= 0:
                    report.note("machine type without GPU count or vCPUs")
                    continue
                out.append(Machine(m.name, series, zone.rsplit("-", 1)[0], zone, float(m.guest_cpus),
                                   round(m.memory_mb / 1024, 3), name, int(gpu.guest_accelerator_count)))
        return out

    def _pages(self, client, name_filter: str | None) -> Iterator[tuple[str, Any]]:
        """(zone, scoped list) over every page; a page that fails after the
        first fails the refresh (never a half-known set of zones)."""
        import requests
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as aexc

        request: dict[str, Any] = {"project": self.project, "max_results": PAGE_SIZE}
        if name_filter:
            request["filter"] = name_filter
        first = True
        try:
            for scope, scoped in client.aggregated_list(request=request, retry=None, timeout=self.timeout):
                first = False
                if scope.startswith("zones/"):
                    yield scope.removeprefix("zones/"), scoped
        except (aexc.DefaultCredentialsError, aexc.TransportError, gexc.GoogleAPICallError,
                requests.ConnectionError, requests.Timeout) as exc:
            if first:
                raise SourceUnavailable(f"GCP Compute API unavailable ({type(exc).__name__})") from exc
            raise


def _with_attached(m: Any, zone: str, gpus: Iterable[str]) -> list:
    """An N1 machine type with each GPU of the zone that it may carry (`gcp_n1`)."""
    from spotbroker.broker.pricing.gcp import Machine

    vcpus, gib = float(m.guest_cpus), round(m.memory_mb / 1024, 3)
    return [Machine(gcp_n1.offer_type(m.name, name, count), gcp_n1.SERIES, zone.rsplit("-", 1)[0], zone,
                    vcpus, gib, name, count)
            for name in gpus for count in gcp_n1.shapes(name) if gcp_n1.fits(name, count, vcpus, gib)]
