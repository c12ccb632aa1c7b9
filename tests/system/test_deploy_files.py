"""deploy/ is checked, not trusted: the compose file renders (anchors merged, variables
interpolated as compose does, a required one refused when missing), the Kubernetes manifests
validate against the API's schemas (kubernetes-validate, strict, schemas shipped in the
package), and every process they start is a command this repository has, with environment
variables the code reads, and exactly one beat."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; $$ is a literal $.
_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


class MissingVariable(Exception):
    pass


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's interpolation over a loaded document."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        present = name in env and (env[name] != "" or not (op or "").startswith(":"))
        if present:
            return env[name]
        if op and op.endswith("?"):
            raise MissingVariable(f"{name}: {arg}")
        if op and op.endswith("-"):
            return arg
        return ""

    return _VARIABLE.sub(one, value)


def compose(env: dict[str, str]) -> dict[str, Any]:
    loaded = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return interpolate(loaded, env)  # type: ignore[no-any-return]


# Read by a library the settings hand over to: boto3's credentials for the artifact bucket
# (S3_BUCKET, django-storages).
READ_BY_LIBRARIES = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def environment_names_read() -> set[str]:
    """Every environment variable the code reads (settings, the server, the runtime), and those
    libraries read for it (``READ_BY_LIBRARIES``)."""
    pattern = re.compile(
        r"(?:environ\.get\(|environ\[|environ\.setdefault\(|getenv\(|_env_int\(|_required\("
        r"|_env_map\(|_env_names\()\s*\"([A-Z][A-Z0-9_]*)\""
    )
    names: set[str] = set(READ_BY_LIBRARIES)
    for package in ("console", "runtime"):
        for path in (ROOT / package).rglob("*.py"):
            names.update(pattern.findall(path.read_text()))
    return names


def check_command(argv: list[str]) -> str:
    """What ``argv`` starts, after checking this repository has it: 'web', 'worker', 'beat',
    'migrate' or another management command."""
    if argv[:2] == ["sh", "-c"]:
        inner = shlex.split(argv[2])
        return check_command(inner[1:] if inner[0] == "exec" else inner)
    if argv[:2] == ["python", "manage.py"]:
        command = argv[2]
        assert command in get_commands(), f"no management command {command!r}"
        if command == "runstack" and "--only" in argv:
            only = argv[argv.index("--only") + 1]
            assert set(only.split(",")) <= {"web", "worker", "beat"}, only
        return command
    if argv[:3] == ["python", "-m", "console.server"]:
        source = (ROOT / "console" / "server.py").read_text()
        for flag in (a for a in argv[3:] if a.startswith("--")):
            assert f'"{flag}"' in source, f"console.server has no {flag}"
        return "web"
    if argv[:3] == ["celery", "-A", "console"]:
        assert importlib.util.find_spec("console.celery") is not None
        assert argv[3] == "worker", argv
        if "-Q" in argv:
            queue = argv[argv.index("-Q") + 1]
            assert queue.startswith("$") or queue in settings.CELERY_QUEUES, queue
        return "worker"
    raise AssertionError(f"unknown command {argv}")


def test_compose_renders_and_refuses_to_start_without_a_secret_key():
    with pytest.raises(MissingVariable, match="SECRET_KEY"):
        compose({})
    rendered = compose({"SECRET_KEY": "k" * 60, "WORKERS": "4"})
    services = rendered["services"]
    assert set(services) >= {"postgres", "redis", "migrate", "web", "worker", "beat"}
    app = services["worker"]["environment"]
    assert app["SECRET_KEY"] == "k" * 60 and app["WORKERS"] == "4"
    assert app["DATABASE_URL"].startswith("postgres://") and app["REDIS_URL"].startswith("redis://")
    # $$ reaches the shell as $: the worker's command reads WORKERS in the container.
    assert '"${WORKERS:-2}"' in services["worker"]["command"][2]
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)


def test_compose_starts_real_commands_with_settings_names_and_one_beat():
    services = compose({"SECRET_KEY": "k" * 60})["services"]
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None
    image_default = yaml.safe_load(cmd.group(1))
    started = {}
    for name in ("migrate", "web", "worker", "notifier", "beat"):
        argv = services[name].get("command") or image_default
        started[name] = check_command([str(a) for a in argv])
    assert started == {
        "migrate": "migrate",
        "web": "web",
        "worker": "worker",
        "notifier": "worker",
        "beat": "beat",
    }
    read = environment_names_read()
    for name in ("migrate", "web", "worker", "notifier", "beat"):
        unknown = set(services[name]["environment"]) - read
        assert not unknown, f"{name} sets variables nothing reads: {unknown}"
    beat = services["beat"]
    assert beat.get("deploy", {}).get("replicas", 1) == 1 and "scale" not in beat


def test_the_procfile_starts_real_commands():
    kinds = {}
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        if not line.strip():
            continue
        name, _, command = line.partition(":")
        kinds[name] = check_command(shlex.split(command))
    assert kinds == {
        "release": "migrate",
        "web": "web",
        "worker": "worker",
        "notifier": "worker",
        "beat": "beat",
    }


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((path.name, doc))
    return found


def test_kubernetes_manifests_validate_against_the_api_schemas():
    manifests = _manifests()
    assert {doc["kind"] for _, doc in manifests} >= {
        "Deployment", "Service", "ConfigMap", "Secret", "Job"
    }  # fmt: skip
    for name, doc in manifests:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} {doc['kind']} {doc['metadata']['name']}: {exc}")


def test_the_validator_refuses_a_broken_manifest():
    # The check can fail: an unknown field (strict) and a wrong type are refused.
    (_, worker), *_ = [m for m in _manifests() if m[1]["metadata"]["name"].endswith("worker")]
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kubernetes_runs_real_commands_one_beat_and_the_kustomization_is_whole():
    manifests = _manifests()
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (DEPLOY / "k8s" / resource).exists(), resource
    image = kustomization["images"][0]["name"]
    read = environment_names_read()
    started = {}
    for _, doc in manifests:
        if doc["kind"] in ("ConfigMap", "Secret"):
            keys = set(doc.get("data", {})) | set(doc.get("stringData", {}))
            assert not keys - read, (
                f"{doc['metadata']['name']} sets unread variables: {keys - read}"
            )
            continue
        pod = doc["spec"]["template"]["spec"] if "template" in doc["spec"] else None
        if pod is None:
            continue
        for container in pod["containers"]:
            assert container["image"].split(":")[0] == image
            started[doc["metadata"]["name"]] = check_command(container["command"])
            unknown = {e["name"] for e in container.get("env", [])} - read - {"POD_NAME"}
            assert not unknown, unknown
    assert sorted(started.values()) == ["beat", "migrate", "web", "worker", "worker"]
    (beat,) = [doc for _, doc in manifests if doc["metadata"]["name"].endswith("-beat")]
    # Exactly one beat, also during a rollout (Recreate: the old one stops first).
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"


# --- the default process layout reads every queue (issue 34: notifications on their own) -------

_SHELL_DEFAULT = re.compile(r"^\$\{([A-Z_]+):-([^}]*)\}$")
_K8S_REFERENCE = re.compile(r"^\$\(([A-Z_]+)\)$")


def _queues(argv: list[str], env: dict[str, str]) -> list[str]:
    """The queues a worker command reads (its -Q, a variable read from ``env`` or its default)."""
    if argv[:2] == ["sh", "-c"]:
        argv = shlex.split(argv[2])
    value = argv[argv.index("-Q") + 1]
    if match := _SHELL_DEFAULT.match(value):
        value = env.get(match.group(1)) or match.group(2)
    elif match := _K8S_REFERENCE.match(value):
        value = env[match.group(1)]
    return value.split(",")


def _assert_layout(pools: dict[str, list[str]]) -> None:
    """Every queue of the default settings is read, and the notifications' queue by a pool that
    reads no other (a dead webhook holds none of the work queue's slots)."""
    assert set(settings.CELERY_QUEUES) == {settings.CELERY_QUEUE, settings.NOTIFY_QUEUE}
    assert set().union(*pools.values()) >= set(settings.CELERY_QUEUES), pools
    for queues in pools.values():
        if settings.NOTIFY_QUEUE in queues:
            assert queues == [settings.NOTIFY_QUEUE], pools


def test_every_deploy_shape_reads_every_queue_and_notifications_apart():
    services = compose({"SECRET_KEY": "k" * 60})["services"]
    app = {name: s for name, s in services.items() if s.get("image", "").startswith("agent-")}
    _assert_layout(
        {
            name: _queues(service["command"], service["environment"])
            for name, service in app.items()
            if "command" in service and check_command(service["command"]) == "worker"
        }
    )
    procfile = {}
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        name, _, command = line.partition(":")
        argv = shlex.split(command)
        if line.strip() and check_command(argv) == "worker":
            procfile[name] = _queues(argv, {})
    _assert_layout(procfile)
    manifests = _manifests()
    (config,) = [doc for _, doc in manifests if doc["kind"] == "ConfigMap"]
    pods = {}
    for _, doc in manifests:
        template = doc.get("spec", {}).get("template")
        for container in template["spec"]["containers"] if template else []:
            if check_command(container["command"]) == "worker":
                pods[doc["metadata"]["name"]] = _queues(container["command"], config["data"])
    _assert_layout(pods)
