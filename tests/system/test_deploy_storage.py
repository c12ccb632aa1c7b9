"""Artifacts in shared storage in every deploy example (issue 40 point 5): where each process of
the compose file and of the Kubernetes manifests keeps artifact bytes, worked out as the
settings do (``S3_BUCKET`` selects the bucket; otherwise ``ARTIFACT_ROOT``, or
``CONSOLE_DATA_DIR/media/artifacts`` with the image's ``CONSOLE_DATA_DIR``), is the same store
for the web and the workers, and never a per-pod or per-container directory (an ``emptyDir``,
a ``hostPath``, the container's own filesystem)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from tests.system.test_deploy_files import DEPLOY, _manifests, compose

pytestmark = pytest.mark.system

APP_SERVICES = ("migrate", "web", "worker", "notifier", "beat")


def _image_env() -> dict[str, str]:
    """The ENV the image sets (deploy/Dockerfile), under what a deployment sets."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(dict(re.findall(r"([A-Z_]+)=(\S+)", line)))
    return env


def artifact_store(env: dict[str, str], mounts: dict[str, str | None]) -> tuple[str, ...]:
    """Where a process with ``env`` keeps artifacts: ("s3", bucket, endpoint, region), or
    ("volume", name) for the shared volume mounted over the artifacts' directory. ``mounts``:
    mount path to a shared volume's name, or None for one that is not shared (emptyDir,
    hostPath). AssertionError when the bytes would stay with one pod or container."""
    env = {**_image_env(), **{k: str(v) for k, v in env.items()}}
    if env.get("S3_BUCKET"):
        return ("s3", env["S3_BUCKET"], env.get("S3_ENDPOINT_URL", ""), env.get("S3_REGION", ""))
    root = PurePosixPath(
        env.get("ARTIFACT_ROOT") or f"{env.get('CONSOLE_DATA_DIR', '/app/var')}/media/artifacts"
    )
    covering = [m for m in mounts if root == PurePosixPath(m) or PurePosixPath(m) in root.parents]
    assert covering, f"artifacts in {root}: the container's own filesystem, lost with it"
    volume = mounts[max(covering, key=len)]
    assert volume is not None, f"artifacts in {root}: a volume of one pod or container only"
    return ("volume", volume)


def _compose_stores(env: dict[str, str]) -> dict[str, tuple[str, ...]]:
    rendered = compose({"SECRET_KEY": "k" * 60, **env})
    named = set(rendered.get("volumes") or {})
    stores = {}
    for name in APP_SERVICES:
        service = rendered["services"][name]
        mounts: dict[str, str | None] = {}
        for volume in service.get("volumes", []):
            source, _, target = str(volume).partition(":")
            # A named volume is one per host, shared by every service; a bind mount of a
            # relative path too; anything else (an anonymous volume) is the container's own.
            shared = source in named or source.startswith((".", "/"))
            mounts[target.split(":")[0]] = source if shared else None
        stores[name] = artifact_store(service.get("environment", {}), mounts)
    return stores


def test_compose_keeps_artifacts_in_one_store_for_every_service():
    stores = _compose_stores({})
    assert set(stores.values()) == {("volume", "console-data")}, stores
    # Asked for S3, every service uses the same bucket (and the volume no longer matters).
    stores = _compose_stores({"S3_BUCKET": "artifacts", "S3_ENDPOINT_URL": "http://minio:9000"})
    assert set(stores.values()) == {("s3", "artifacts", "http://minio:9000", "")}, stores


def _pod_stores(manifests: list[tuple[str, dict[str, Any]]]) -> dict[str, tuple[str, ...]]:
    config: dict[str, str] = {}
    for _, doc in manifests:
        if doc["kind"] in ("ConfigMap", "Secret"):
            config.update(doc.get("data") or {})
            config.update(doc.get("stringData") or {})
    stores = {}
    for _, doc in manifests:
        template = doc.get("spec", {}).get("template")
        if not template:
            continue
        pod = template["spec"]
        volumes = {
            v["name"]: (v["persistentVolumeClaim"]["claimName"] if "persistentVolumeClaim" in v
                        else None)
            for v in pod.get("volumes", [])
        }  # fmt: skip
        for container in pod["containers"]:
            assert all("configMapRef" in s or "secretRef" in s for s in container["envFrom"])
            env = {**config, **{e["name"]: e.get("value", "") for e in container.get("env", [])}}
            mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
            stores[doc["metadata"]["name"]] = artifact_store(env, mounts)
    return stores


def test_kubernetes_keeps_artifacts_in_one_bucket_for_every_pod():
    stores = _pod_stores(_manifests())
    assert {name.rsplit("-", 1)[1] for name in stores} == set(APP_SERVICES), stores
    assert len(set(stores.values())) == 1, stores
    (store,) = set(stores.values())
    assert store[0] == "s3" and store[1], store


def test_the_check_refuses_artifacts_on_a_pods_own_volume():
    # The check can fail: without the bucket, the manifests' /data is an emptyDir per pod (the
    # example as it was: each web replica and worker with artifacts of its own).
    manifests = yaml.safe_load(yaml.safe_dump(_manifests()))
    for _, doc in manifests:
        if doc["kind"] == "ConfigMap":
            del doc["data"]["S3_BUCKET"]
    with pytest.raises(AssertionError, match="a volume of one pod or container only"):
        _pod_stores(manifests)
    # And a claim every pod mounts there is accepted as shared storage.
    for _, doc in manifests:
        template = doc.get("spec", {}).get("template")
        for volume in template["spec"]["volumes"] if template else []:
            if volume["name"] == "data":
                volume.pop("emptyDir")
                volume["persistentVolumeClaim"] = {"claimName": "artifacts"}
    assert set(_pod_stores(manifests).values()) == {("volume", "artifacts")}


def test_the_image_carries_the_s3_extra():
    # The bucket needs boto3 in the image: the lock file the image installs has it.
    lock = (DEPLOY.parent / "requirements" / "lock.txt").read_text()
    assert re.search(r"^boto3==", lock, re.M)
    assert re.search(r"^django-storages==", lock, re.M)
