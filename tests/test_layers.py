"""The import contract (tests/layers.py) holds for the tree, and it can fail."""

from __future__ import annotations

from tests import layers


def test_the_tree_keeps_the_import_contract():
    assert layers.breaches() == []


def test_the_contract_sees_a_cycle_a_domain_import_of_console_and_an_import_of_the_worker():
    edges = layers.graph()
    # What a function-level import used to hide: the outbox importing the worker.
    edges["runtime.outbox"] = edges["runtime.outbox"] | {"runtime.worker"}
    edges["runtime.tasks"] = edges["runtime.tasks"] | {"console.api.views"}
    edges["runtime.models"] = edges["runtime.models"] | {"runtime.transitions.propose"}
    problems = layers.breaches(edges)
    assert any(p.startswith("import cycle:") and "runtime.outbox" in p for p in problems)
    assert "runtime.tasks imports console (the domain knows nothing of HTTP)" in problems
    assert any(p.startswith("runtime.outbox imports runtime.worker") for p in problems)
    assert any(p.startswith("runtime.models (bottom layer) imports") for p in problems)


def test_imports_in_type_checking_and_try_blocks_count(tmp_path):
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from runtime.transitions.propose import OperationSpec\n"
        "try:\n    from runtime.tasks import task_get\nexcept ImportError:\n    pass\n"
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    known = {"runtime.transitions.propose": path, "runtime.tasks": path, "runtime.m": path}
    assert layers.imports_of("runtime.m", path, known) == {
        "runtime.transitions.propose",
        "runtime.tasks",
    }


def test_a_rule_table_importing_a_service_breaches_the_bottom_layer():
    edges = layers.graph()
    assert "runtime.rules.claim" in edges or "runtime.rules.stop" in edges
    edges["runtime.rules.stop"] = edges["runtime.rules.stop"] | {"runtime.transitions.claim"}
    problems = layers.breaches(edges)
    assert any(p.startswith("runtime.rules.stop (bottom layer) imports") for p in problems)


def test_no_module_or_function_outgrows_the_limits_but_those_still_pending():
    assert layers.oversized() == []


def test_the_pending_list_names_only_what_is_still_too_big():
    # An entry left behind after its split would let the module grow back unseen.
    pending_only = layers.PENDING_SIZES
    layers.PENDING_SIZES = frozenset()
    try:
        still_big = {p.partition(" is ")[0] for p in layers.oversized()}
    finally:
        layers.PENDING_SIZES = pending_only
    assert pending_only - still_big == set()


def test_the_layers_run_from_the_tables_up_to_the_console_and_an_upward_import_breaches():
    names = [name for name, _ in layers.LAYERS]
    assert names.index("transitions") < names.index("services") < names.index("worker")
    assert names.index("worker") < names.index("console")
    of = {m: layers.LAYERS[layers.layer_of(m)][0] for m in layers.modules()}
    assert of["runtime.transitions.claim"] == "transitions"
    assert of["runtime.selectors.tasks"] == "selectors"
    assert of["runtime.approvals"] == "services"  # a module named nowhere is a service
    assert of["runtime.rules.claim"] == "bottom"
    edges = layers.graph()
    # A ledger reaching up to a transition, and a read reaching up to a service.
    edges["runtime.budgets"] = edges["runtime.budgets"] | {"runtime.transitions.claim"}
    edges["runtime.selectors.tasks"] = edges["runtime.selectors.tasks"] | {"runtime.approvals"}
    problems = layers.breaches(edges)
    assert (
        "runtime.budgets (foundation) imports upward: runtime.transitions.claim (transitions)"
        in (problems)
    )
    assert any(p.startswith("runtime.selectors.tasks (selectors) imports upward") for p in problems)
