"""The DRA driver's ResourceSlices: which GPU UUID each DRA device name stands for (opt-in).

The kubelet names a GPU allocated through a ResourceClaim by ``driver/pool/device``
(``gpu.nvidia.com/<node>/gpu-0``); only the driver's ResourceSlice says which GPU that is: NVIDIA's
DRA driver (github.com/NVIDIA/k8s-dra-driver-gpu) publishes one per node with each device's
attributes, ``type`` (``gpu`` or ``mig``) and ``uuid`` (the GPU's, or the MIG device's UUID).
With ``NVGPU_DRA_RESOURCESLICES=true`` the pod-attribution extension lists this node's slices
(``fieldSelector=spec.nodeName=<NVGPU_NODE_NAME>``) from the API server every
``NVGPU_POD_REFRESH_SECONDS`` and passes :func:`device_uuids` of them to the mapping
(:func:`exporter.supervisor.podresources.client.assignments`).

The least RBAC it needs: ``list`` on ``resourceslices`` of API group ``resource.k8s.io``
(cluster-scoped; deploy/kubernetes/components/dra-resourceslices binds exactly that, and mounts the
service-account token the base leaves out). The group's versions are tried newest first: ``v1``
(Kubernetes 1.34), ``v1beta2`` (1.33), ``v1beta1`` (1.32), whose devices keep their attributes
under ``basic``. Standard library only: the in-cluster service-account token and CA, one HTTPS
GET with a deadline, JSON.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from exporter.common import fileio

__all__ = ["API_VERSIONS", "ResourceSliceError", "ResourceSliceReader", "device_uuids"]

API_VERSIONS = ("v1", "v1beta2", "v1beta1")
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_BYTES = 16 << 20  # a node's slices are a few KiB; a larger answer is not what was asked for
ACCOUNT_FILE_MAX_BYTES = 1 << 20  # the token (a JWT, ~1 KiB) and ca.crt (a few KiB)


class ResourceSliceError(Exception):
    """The ResourceSlices could not be listed; the message says what to fix."""


def _string(attributes: Mapping[str, Any], name: str) -> str:
    """A string attribute, unqualified or qualified by any domain (``uuid``, ``gpu.nvidia.com/uuid``)."""
    for key, value in attributes.items():
        if (key == name or key.endswith("/" + name)) and isinstance(value, Mapping):
            text = value.get("string")
            if isinstance(text, str):
                return text
    return ""


def device_uuids(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) -> the device's ``uuid`` attribute, for every device of every slice
    that carries one (a GPU's ``GPU-…``, a MIG device's ``MIG-…``).

    Args:
        slices: ResourceSlice objects as the API server returns them (``items`` of a list).
    """
    out: dict[tuple[str, str, str], str] = {}
    for item in slices:
        spec = item.get("spec") if isinstance(item, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        driver = spec.get("driver")
        pool = spec.get("pool", {}).get("name") if isinstance(spec.get("pool"), Mapping) else None
        if not isinstance(driver, str) or not isinstance(pool, str):
            continue
        for dev in spec.get("devices") or ():
            if not isinstance(dev, Mapping) or not isinstance(dev.get("name"), str):
                continue
            attrs = dev.get("attributes")
            if attrs is None and isinstance(dev.get("basic"), Mapping):  # v1beta1
                attrs = dev["basic"].get("attributes")
            uuid = _string(attrs, "uuid") if isinstance(attrs, Mapping) else ""
            if uuid.startswith(("GPU-", "MIG-")):
                out[(driver, pool, dev["name"])] = uuid
    return out


class ResourceSliceReader:
    """Lists this node's ResourceSlices with the pod's service-account token (blocking: run it in a thread).

    Args:
        node: this node's name (``NVGPU_NODE_NAME``, from the downward API's ``spec.nodeName``).
        server: ``https://host:port`` of the API server (default: ``KUBERNETES_SERVICE_HOST`` and
            ``_PORT``, as every in-cluster client finds it).
        account_dir: where the token and ``ca.crt`` are mounted.
        timeout_s: deadline of each request.
    """

    def __init__(
        self,
        node: str,
        server: str | None = None,
        account_dir: str = SERVICE_ACCOUNT,
        timeout_s: float = 5.0,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        if server is None:
            host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}" if host else ""
        self.node = node
        self.server = server
        self.account_dir = account_dir
        self.timeout_s = timeout_s
        self._version: str | None = None

    def _account_files(self) -> tuple[str, str]:
        """The service-account token and CA (PEM), each opened without blocking and bounded
        (:func:`exporter.common.fileio.read_bytes`: a FIFO or a device node there is refused, not
        waited on).

        Raises:
            ResourceSliceError: either file is missing, unreadable or not a regular file.
        """
        texts = []
        for name in ("token", "ca.crt"):
            path = os.path.join(self.account_dir, name)
            try:
                texts.append(fileio.read_bytes(path, ACCOUNT_FILE_MAX_BYTES).decode("utf-8", "replace").strip())
            except fileio.FileRefused as exc:
                raise ResourceSliceError(
                    f"no service-account {name} in {self.account_dir} ({exc.detail}); "
                    "deploy/kubernetes/components/dra-resourceslices mounts it"
                ) from None
        return texts[0], texts[1]

    def list(self) -> dict[tuple[str, str, str], str]:
        """:func:`device_uuids` of this node's slices.

        Raises:
            ResourceSliceError: no API server or token, the request failed, or no version of
                ``resource.k8s.io`` is served.
        """
        if not self.server:
            raise ResourceSliceError("no API server: KUBERNETES_SERVICE_HOST is not set (not in a pod?)")
        token, ca = self._account_files()
        try:
            context = ssl.create_default_context(cadata=ca)
        except (ssl.SSLError, ValueError) as exc:
            raise ResourceSliceError(
                f"{os.path.join(self.account_dir, 'ca.crt')}: not a CA certificate ({exc})"
            ) from None
        problems = []
        for version in [self._version] if self._version else API_VERSIONS:
            query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node}"})
            url = f"{self.server}/apis/resource.k8s.io/{version}/resourceslices?{query}"
            request = urllib.request.Request(
                url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as resp:  # noqa: S310
                    body = resp.read(MAX_BYTES + 1)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    problems.append(f"{version}: not served")
                    continue
                why = "forbidden: bind the ClusterRole of components/dra-resourceslices" if exc.code == 403 else ""
                raise ResourceSliceError(f"GET {url}: HTTP {exc.code} {exc.reason} {why}".strip()) from None
            except (OSError, ValueError) as exc:
                raise ResourceSliceError(f"GET {url}: {exc}") from None
            if len(body) > MAX_BYTES:
                raise ResourceSliceError(f"GET {url}: answer larger than {MAX_BYTES} bytes")
            try:
                items = json.loads(body).get("items") or []
            except (ValueError, AttributeError) as exc:
                raise ResourceSliceError(f"GET {url}: not a ResourceSliceList ({exc})") from None
            self._version = version
            return device_uuids(items)
        raise ResourceSliceError(f"resource.k8s.io ResourceSlices are not served ({'; '.join(problems)})")
