"""Client of the kubelet PodResources v1 gRPC API: which pod and container holds each GPU.

The kubelet serves ``v1.PodResourcesLister`` on a unix socket (by default
``/var/lib/kubelet/pod-resources/kubelet.sock``). ``List`` returns every pod on the node with the
device-plugin devices assigned to each of its containers; for NVIDIA's device plugin those are GPU
UUIDs (``GPU-…``), MIG device UUIDs (``MIG-…``) and, for GPUs shared by time-slicing or MPS,
replica ids ``<uuid>::<n>``. This module turns that into ``{uuid: (PodRef, …)}``.

Dynamic Resource Allocation: a GPU allocated through a ResourceClaim is not in ``devices`` but in
the container's ``dynamic_resources`` (served from Kubernetes 1.27 behind the
``KubeletPodResourcesDynamicResources`` gate, on by default from 1.34): per claim
(``claim_namespace``/``claim_name``) each allocated device as ``driver_name``/``pool_name``/
``device_name`` plus its CDI device names. NVIDIA's DRA driver (``gpu.nvidia.com``,
github.com/NVIDIA/k8s-dra-driver-gpu) names a GPU ``gpu-<n>`` (its minor number in current
releases, its index in older ones) and a MIG device ``gpu-<n>-mig-<profile>-<start>-<size>``;
neither carries the UUID, and its CDI names are ``k8s.gpu.nvidia.com/device=<claim uid>-<device>``.
The UUID comes from the CDI names where they carry one (a CDI spec generated with the UUID
device-name strategy: ``nvidia.com/gpu=GPU-…``), else from the driver's ResourceSlice (its
devices' ``uuid`` attribute), which the caller passes as a lookup (:class:`DraDevice.key` ->
UUID). A device of a GPU driver that neither names is returned unmapped, never dropped
(:func:`assignments`). These functions take the parsed ``ListPodResourcesResponse``: the
transport only has to deliver that message.

The calls go over HTTP/2 with ``h2`` (:mod:`exporter.supervisor.podresources.transport`) and the
messages are the generated protobuf classes (``v1/api_pb2.py``, parsed by the protobuf runtime),
so a caller gets the same message objects as from a grpcio stub. h2 and protobuf are an optional
extra (``nvgpu-exporter[kubernetes]``). They are imported only when a client is built, through
:func:`importlib.import_module`, so the exporter imports and runs without them; the feature then
reports itself unsupported (:class:`PodResourcesUnsupported`, :func:`unsupported_reason`).

Every call is a blocking call with a deadline, on a connection of its own (a restarted kubelet,
a new socket, is reached on the next call). The supervisor runs them in a thread executor on an
interval, never on the event loop. Failures of the socket or the call raise one
class, :class:`PodResourcesError`, whose message says what to fix and whose ``reason`` is a short
stable word for metrics and log-once keys.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import stat
import threading
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_S = 5.0

# The kubelet's own pod-resources client allows 16 MiB responses (gRPC's default is 4 MiB); a
# node with many pods and many CPU/memory assignments can pass 4 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# Extended resources of NVIDIA's device plugin: nvidia.com/gpu, nvidia.com/gpu.shared
# (time-slicing with renameByDefault), nvidia.com/mig-<profile> (MIG "mixed" strategy).
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"

# Device ids we can join to NVML's nvmlDeviceGetUUID: full GPUs and MIG devices (R470+ format).
_UUID_PREFIXES = ("GPU-", "MIG-")

# The NVIDIA device plugin's GPU resources: whole or shared GPUs and MIG devices. Their device ids
# are GPU or MIG UUIDs unless the plugin runs with deviceIDStrategy=index ("0", "0:1"); an id of
# one of these resources that is not a UUID is a GPU the exporter cannot name (counted by
# exporter.supervisor.pods). Other nvidia.com/ resources (network devices by PCI address) are not GPUs.
_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def is_gpu_resource(resource: str) -> bool:
    """Whether ``resource`` is one of the NVIDIA device plugin's GPU or MIG resources."""
    return resource in _GPU_RESOURCES or resource.startswith(_MIG_RESOURCE_PREFIX)


# Separator NVIDIA's device plugin puts between a GPU's id and its replica number when a GPU is
# shared (time-slicing, MPS): "GPU-8f6b…::0", "GPU-8f6b…::1", …
_REPLICA_SEPARATOR = "::"

_INSTALL_HINT = "install the 'kubernetes' extra: pip install 'nvgpu-exporter[kubernetes]'"
SERVICE = "/v1.PodResourcesLister/"  # package v1, service PodResourcesLister (proto/podresources/v1/api.proto)


@dataclasses.dataclass(frozen=True, order=True)
class PodRef:
    """One container that the kubelet assigned a device to."""

    namespace: str
    pod: str
    container: str


# DRA drivers whose devices are GPUs (an unresolved device of theirs is counted, not ignored).
DRA_GPU_DRIVERS = ("gpu.nvidia.com",)


@dataclasses.dataclass(frozen=True, order=True)
class DraDevice:
    """One device allocated to a ResourceClaim, as the kubelet reports it under ``dynamic_resources``.

    Attributes:
        driver: the DRA driver (``gpu.nvidia.com``).
        pool: the driver's resource pool (NVIDIA's driver: the node name).
        device: the device's name in the pool (``gpu-0``).
        claim_namespace: the ResourceClaim's namespace.
        claim_name: the ResourceClaim's name.
        cdi_devices: the fully qualified CDI device names the kubelet prepared.
    """

    driver: str
    pool: str
    device: str
    claim_namespace: str = ""
    claim_name: str = ""
    cdi_devices: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        """(driver, pool, device): the device in the driver's ResourceSlice."""
        return (self.driver, self.pool, self.device)

    def describe(self) -> str:
        """``gpu.nvidia.com/node-1/gpu-0 of claim ml/train-gpu``."""
        return f"{self.driver}/{self.pool}/{self.device} of claim {self.claim_namespace}/{self.claim_name}"


def uuid_from_cdi_devices(names: Iterable[str]) -> str | None:
    """The GPU or MIG UUID a CDI device name carries (``nvidia.com/gpu=GPU-…``), or None.

    A CDI name is ``<vendor>/<class>=<device>`` (the CDI specification); NVIDIA's container
    toolkit names devices by UUID with ``--device-name-strategy=uuid``, by index by default, and
    NVIDIA's DRA driver by claim and device (``k8s.gpu.nvidia.com/device=<claim uid>-gpu-0``),
    which carries none.
    """
    for name in names:
        _kind, sep, device = name.partition("=")
        uuid = gpu_uuid_from_device_id(device) if sep else None
        if uuid is not None:
            return uuid
    return None


@dataclasses.dataclass(frozen=True)
class Assignments:
    """Who holds which GPU, from one ``List`` answer.

    Attributes:
        gpus: GPU/MIG UUID -> containers holding it (device plugin and DRA together), see
            :func:`gpu_assignments`.
        not_a_uuid: device-plugin ids of GPU resources that are not UUIDs -> containers, see
            :func:`unmapped_assignments`.
        dra_unresolved: DRA devices of a GPU driver (:data:`DRA_GPU_DRIVERS`) that neither their
            CDI names nor the ResourceSlice lookup map to a UUID -> containers.
    """

    gpus: dict[str, tuple[PodRef, ...]] = dataclasses.field(default_factory=dict)
    not_a_uuid: dict[str, tuple[PodRef, ...]] = dataclasses.field(default_factory=dict)
    dra_unresolved: dict[DraDevice, tuple[PodRef, ...]] = dataclasses.field(default_factory=dict)


def dra_devices(response: Any) -> dict[DraDevice, tuple[PodRef, ...]]:
    """Every device of every ResourceClaim in a ``ListPodResourcesResponse``, with the containers
    it is prepared for (a kubelet without DRA sends none)."""
    found: dict[DraDevice, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for claim in container.dynamic_resources:
                for res in claim.claim_resources:
                    dev = DraDevice(
                        driver=res.driver_name,
                        pool=res.pool_name,
                        device=res.device_name,
                        claim_namespace=claim.claim_namespace,
                        claim_name=claim.claim_name,
                        cdi_devices=tuple(c.name for c in res.cdi_devices),
                    )
                    found.setdefault(dev, set()).add(ref)
    return {d: tuple(sorted(found[d])) for d in sorted(found)}


def assignments(response: Any, dra_uuids: Mapping[tuple[str, str, str], str] | None = None) -> Assignments:
    """The GPUs and MIG devices of one ``List`` answer, device plugin and DRA together.

    Args:
        response: a parsed ``v1.ListPodResourcesResponse`` (or anything shaped like one).
        dra_uuids: (driver, pool, device) -> GPU or MIG UUID, from the DRA driver's ResourceSlice
            (its devices' ``uuid`` attribute); empty or None without that lookup.

    Returns:
        :class:`Assignments`; a DRA device is mapped from its CDI names first, then the lookup.
    """
    gpus: dict[str, set[PodRef]] = {u: set(refs) for u, refs in gpu_assignments(response).items()}
    unresolved: dict[DraDevice, tuple[PodRef, ...]] = {}
    for dev, refs in dra_devices(response).items():
        uuid = uuid_from_cdi_devices(dev.cdi_devices) or (dra_uuids or {}).get(dev.key)
        if uuid is not None:
            gpus.setdefault(uuid, set()).update(refs)
        elif dev.driver in DRA_GPU_DRIVERS:
            unresolved[dev] = refs
    return Assignments(
        gpus={u: tuple(sorted(gpus[u])) for u in sorted(gpus)},
        not_a_uuid=unmapped_assignments(response),
        dra_unresolved=unresolved,
    )


class PodResourcesError(Exception):
    """The kubelet's pod-resources socket could not be read, or the call failed or timed out.

    Attributes:
        reason: one of ``socket_missing``, ``not_a_socket``, ``permission_denied``, ``timeout``,
            ``unavailable``, ``unimplemented``, ``rpc_error``; stable, for log-once keys.
        socket_path: the socket the client was built for.
    """

    def __init__(self, reason: str, socket_path: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.socket_path = socket_path


class PodResourcesUnsupported(Exception):
    """h2/protobuf are missing or of an unusable version: pod attribution cannot run."""


class _Api:
    """The lazily imported pieces: the generated messages (typed as Any at this boundary)."""

    def __init__(self, transport: ModuleType, pb2: ModuleType) -> None:
        self.transport = transport
        self.pb2 = pb2


_api_lock = threading.Lock()
_api: _Api | None = None
_api_error: str | None = None


def _load_api() -> _Api:
    """Import h2 and the generated messages once; raise PodResourcesUnsupported on failure."""
    global _api, _api_error
    with _api_lock:
        if _api is not None:
            return _api
        if _api_error is not None:
            raise PodResourcesUnsupported(_api_error)
        try:
            # everything a call needs, now: a process that drops privileges afterwards may no
            # longer read its own library directories
            transport = importlib.import_module("exporter.supervisor.podresources.transport")
            pb2 = importlib.import_module("exporter.supervisor.podresources.v1.api_pb2")
        except ImportError as exc:
            _api_error = f"pod attribution needs h2 and protobuf ({exc}); {_INSTALL_HINT}"
        except Exception as exc:
            # The generated module carries no version guard (regenerate.py: grpcio-tools 1.62.3), but
            # a protobuf outside the tested range may still fail to load it.
            _api_error = (
                f"pod attribution cannot load its generated protobuf messages: {type(exc).__name__}: {exc}; "
                f"{_INSTALL_HINT}"
            )
        else:
            _api = _Api(transport, pb2)
            return _api
        raise PodResourcesUnsupported(_api_error)


def unsupported_reason() -> str | None:
    """Why pod attribution cannot run in this process, or None when its dependencies load."""
    try:
        _load_api()
    except PodResourcesUnsupported as exc:
        return str(exc)
    return None


def gpu_uuid_from_device_id(device_id: str) -> str | None:
    """The GPU or MIG UUID a device-plugin id stands for, or None for ids that are not UUIDs.

    ``GPU-…`` and ``MIG-…`` come back unchanged; a shared replica ``GPU-…::3`` comes back as
    ``GPU-…`` (every replica of one GPU maps to that GPU). Ids from the device plugin's ``index``
    id strategy (``"0"``, ``"0:1"``) and other NVIDIA resources (e.g. network devices by PCI
    address) return None: they cannot be joined to NVML's UUIDs.
    """
    base, sep, replica = device_id.rpartition(_REPLICA_SEPARATOR)
    if sep and replica.isdigit():
        device_id = base
    if device_id.startswith(_UUID_PREFIXES):
        return device_id
    return None


_skipped_logged: set[tuple[str, str]] = set()


def _uuids_of(devices: Iterable[Any]) -> Iterable[str]:
    """UUIDs of the NVIDIA device ids in ContainerDevices messages (replicas included, repeated)."""
    for dev in devices:
        resource: str = dev.resource_name
        if not resource.startswith(NVIDIA_RESOURCE_PREFIX):
            continue
        for device_id in dev.device_ids:
            uuid = gpu_uuid_from_device_id(device_id)
            if uuid is not None:
                yield uuid
            elif is_gpu_resource(resource):
                continue  # a GPU without a UUID: unmapped_assignments(); exporter.supervisor.pods counts and logs it
            elif (resource, device_id) not in _skipped_logged:
                _skipped_logged.add((resource, device_id))
                logger.info(
                    "pod attribution: device id %r of resource %s is not a GPU or MIG UUID; not attributed",
                    device_id,
                    resource,
                )


def unmapped_assignments(response: Any) -> dict[str, tuple[PodRef, ...]]:
    """Device ids of GPU or MIG resources (:func:`is_gpu_resource`) that are not UUIDs, with the
    containers holding them: GPUs assigned to pods that the exporter cannot name.

    Returns:
        ``{device id: (PodRef, …)}``, keys sorted; empty with the default id strategy.
    """
    found: dict[str, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for dev in container.devices:
                if not is_gpu_resource(dev.resource_name):
                    continue
                for device_id in dev.device_ids:
                    if gpu_uuid_from_device_id(device_id) is None:
                        found.setdefault(device_id, set()).add(ref)
    return {i: tuple(sorted(found[i])) for i in sorted(found)}


def gpu_assignments(response: Any) -> dict[str, tuple[PodRef, ...]]:
    """Map each GPU/MIG UUID in a ``ListPodResourcesResponse`` to the containers holding it.

    Args:
        response: a ``v1.ListPodResourcesResponse`` message (or anything shaped like one).

    Returns:
        ``{uuid: (PodRef, …)}``, keys sorted, each tuple sorted and without duplicates. A GPU
        shared by time-slicing or MPS lists every container holding one of its replicas. MIG
        devices are keyed by their MIG UUID: mapping them to their parent GPU is the caller's
        (NVML's) business. GPUs assigned to nobody are absent.
    """
    found: dict[str, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for uuid in _uuids_of(container.devices):
                found.setdefault(uuid, set()).add(ref)
    return {uuid: tuple(sorted(found[uuid])) for uuid in sorted(found)}


def allocatable_replicas(response: Any) -> dict[str, int]:
    """Count the allocatable device ids per GPU/MIG UUID in an ``AllocatableResourcesResponse``.

    Returns:
        ``{uuid: n}``: 1 for a GPU handed out whole, the replica count for a shared GPU.
    """
    counts: dict[str, int] = {}
    for uuid in _uuids_of(response.devices):
        counts[uuid] = counts.get(uuid, 0) + 1
    return dict(sorted(counts.items()))


def allocatable_unparsed(response: Any) -> tuple[str, ...]:
    """Sorted distinct ids of GPU/MIG resources in an ``AllocatableResourcesResponse`` that are not
    UUIDs (``deviceIDStrategy=index``): devices the node offers that cannot be joined to a GPU."""
    ids = (i for d in response.devices if is_gpu_resource(d.resource_name) for i in d.device_ids)
    return tuple(sorted({i for i in ids if gpu_uuid_from_device_id(i) is None}))


def _socket_error(socket_path: str, reason: str, detail: str) -> PodResourcesError:
    return PodResourcesError(reason, socket_path, f"kubelet pod-resources socket {socket_path}: {detail}")


def check_socket(socket_path: str) -> None:
    """Fail with a clear message if ``socket_path`` is not a unix socket this process can connect to.

    Standard library only: the supervisor checks the socket before it loads h2 and protobuf
    (a few MB, docs/performance.md).

    Raises:
        PodResourcesError: reason ``socket_missing``, ``permission_denied`` or ``not_a_socket``.
    """
    try:
        st = os.stat(socket_path)
    except FileNotFoundError:
        raise _socket_error(
            socket_path,
            "socket_missing",
            "does not exist; mount the kubelet's pod-resources directory "
            "(hostPath /var/lib/kubelet/pod-resources, readOnly) or set "
            "NVGPU_POD_RESOURCES_SOCKET, or turn the feature off "
            "(NVGPU_FEATURE_POD_ATTRIBUTION=off)",
        ) from None
    except PermissionError as exc:
        raise _socket_error(socket_path, "permission_denied", f"cannot be looked up: {exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise _socket_error(socket_path, "not_a_socket", "exists but is not a unix socket")
    # connect() on a unix socket needs write permission on the socket file. The kubelet
    # creates it owned by root and not writable by others, so a non-root exporter is refused
    # (docs/kubernetes.md, "Pod attribution").
    if not os.access(socket_path, os.R_OK | os.W_OK):
        raise _socket_error(
            socket_path,
            "permission_denied",
            f"is not readable and writable by uid {os.geteuid()} (socket owner uid "
            f"{st.st_uid}, mode {stat.filemode(st.st_mode)}); the kubelet's socket is "
            "root-owned: run the exporter as uid 0 with no capabilities "
            "(deploy/kubernetes/components/pod-attribution-root) or turn the feature off",
        )


class PodResourcesClient:
    """Blocking client of the kubelet's PodResources v1 service on a unix socket.

    Thread-safe (each call has its own connection); meant to be called from a thread executor.

    Args:
        socket_path: the kubelet's pod-resources socket.
        timeout_s: deadline of each call, connection included, in seconds.

    Raises:
        PodResourcesUnsupported: h2/protobuf missing or unusable (nothing is connected yet).
        ValueError: timeout_s is not positive.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = DEFAULT_TIMEOUT_S):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self._api = _load_api()
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing is kept between calls; kept so that callers can close what they built."""

    def list(self) -> Any:
        """Call ``List``: the ``v1.ListPodResourcesResponse`` message (generated class).

        Raises:
            PodResourcesError: socket missing/unreadable, kubelet unavailable, timeout, RPC error.
        """
        return self._call("List", self._api.pb2.ListPodResourcesRequest(), self._api.pb2.ListPodResourcesResponse)

    def get_allocatable_resources(self) -> Any:
        """Call ``GetAllocatableResources``: the ``v1.AllocatableResourcesResponse`` message.

        Raises:
            PodResourcesError: as for :meth:`list` (reason ``unimplemented`` where the kubelet does
                not serve the call).
        """
        return self._call(
            "GetAllocatableResources",
            self._api.pb2.AllocatableResourcesRequest(),
            self._api.pb2.AllocatableResourcesResponse,
        )

    def list_gpu_assignments(self) -> dict[str, tuple[PodRef, ...]]:
        """Call ``List`` and map each GPU/MIG UUID to the containers holding it.

        Returns:
            See :func:`gpu_assignments`.

        Raises:
            PodResourcesError: socket missing/unreadable, kubelet unavailable, timeout, RPC error.
        """
        return gpu_assignments(self.list())

    def list_assignments(self, dra_uuids: Mapping[tuple[str, str, str], str] | None = None) -> Assignments:
        """Call ``List`` once and map it (:func:`assignments`): device-plugin and DRA GPUs, and
        what cannot be mapped.

        Raises:
            PodResourcesError: as for :meth:`list_gpu_assignments`.
        """
        return assignments(self.list(), dra_uuids)

    def allocatable_gpus(self) -> dict[str, int] | None:
        """Call ``GetAllocatableResources``: the GPUs/MIG devices the node can hand out.

        Returns:
            ``{uuid: allocatable ids}`` (see :func:`allocatable_replicas`), or None when this
            kubelet does not serve the call (UNIMPLEMENTED before Kubernetes 1.21, or the
            KubeletPodResourcesGetAllocatable feature gate turned off).

        Raises:
            PodResourcesError: as for :meth:`list_gpu_assignments`.
        """
        found = self.allocatable()
        return None if found is None else found[0]

    def allocatable(self) -> tuple[dict[str, int], tuple[str, ...]] | None:
        """:meth:`allocatable_gpus` and :func:`allocatable_unparsed` of one call (None, raises: as it)."""
        try:
            response = self.get_allocatable_resources()
        except PodResourcesError as exc:
            if exc.reason == "unimplemented":
                return None
            raise
        return allocatable_replicas(response), allocatable_unparsed(response)

    # -- internals ---------------------------------------------------------------------------

    def _error(self, reason: str, detail: str) -> PodResourcesError:
        return _socket_error(self.socket_path, reason, detail)

    def _call(self, method: str, request: Any, response_class: Any) -> Any:
        """One call; the socket is checked first, so its problems read better than UNAVAILABLE."""
        transport = self._api.transport
        check_socket(self.socket_path)
        try:
            raw = transport.unary_call(
                self.socket_path, SERVICE + method, request.SerializeToString(), self.timeout_s, MAX_MESSAGE_BYTES
            )
        except transport.CallFailed as exc:
            code, details = exc.code, exc.details
            if code == "DEADLINE_EXCEEDED":
                raise self._error("timeout", f"{method} did not answer within {self.timeout_s:g} s") from None
            if code == "UNAVAILABLE":
                raise self._error("unavailable", f"{method}: kubelet not reachable ({details})") from None
            if code == "UNIMPLEMENTED" or (
                # With the KubeletPodResourcesGetAllocatable gate off (1.21-1.27), the kubelet
                # answers Unknown "Pod Resources API GetAllocatableResources disabled".
                code == "UNKNOWN" and "disabled" in details.lower()
            ):
                raise self._error("unimplemented", f"{method} is not served by this kubelet ({details})") from None
            raise self._error("rpc_error", f"{method} failed: {code}: {details}") from None
        try:
            return response_class.FromString(raw)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError: a response we cannot parse
            raise self._error("rpc_error", f"{method} answered a message that does not parse: {exc}") from None
