"""The boundary between the families and TRL (issue 12): families talk to a narrow Host; TRL's private surface lives in
trainer.py and the adapter package (trl_grpo_ext/adapter: the rollout service, the plain-TRL source of the monitor,
the copies) only, is declared, and exists in the installed TRL; no module-level import cycle."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import scored_batch

PACKAGE = Path(__file__).resolve().parent.parent / "trl_grpo_ext"
FAMILY_MODULES = sorted((PACKAGE / "families").glob("*.py"))
#: Objects a family module must not reach: the trainer and accelerate live behind the host.
FORBIDDEN_NAMES = {"trainer", "accelerator", "_trainer"}


def _attribute_chains(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node


@pytest.mark.parametrize("path", FAMILY_MODULES, ids=[p.name for p in FAMILY_MODULES])
def test_family_modules_touch_only_the_host(path):
    tree = ast.parse(path.read_text())
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append(f"line {node.lineno}: name {node.id!r}")
        if isinstance(node, ast.Attribute):
            if node.attr in FORBIDDEN_NAMES:
                problems.append(f"line {node.lineno}: .{node.attr}")
            # a private attribute of anything but the extension itself (self._window is its own state)
            owner = node.value
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    problems.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            # hooks return what they change (GenerationUpdate): TRL's batch is never written by a family
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                written = ast.unparse(target)
                if written.startswith(("batch.", "out[", "output[")) or ".output[" in written:
                    problems.append(f"line {node.lineno}: writes {written}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            names = [a.name for a in node.names]
            if module.endswith("trainer") or "accelerate" in module or any("accelerate" in n for n in names):
                problems.append(f"line {node.lineno}: imports {module or names}")
    assert not problems, f"{path.name} reaches past the Host: {problems}"


def test_extensions_receive_the_host_and_the_services_they_name_not_the_trainer(make_trainer):
    from trl_grpo_ext.adapter.host import BetaService, TrainerHost
    from trl_grpo_ext.adapter.rollouts import RolloutService

    trainer = make_trainer(
        token_clip="clip_cov", sample_filter="best_of_n", kl_control="adaptive", beta=0.04, entropy_control="aepo"
    )
    members = trainer.extensions
    assert members and all(type(e.host) is TrainerHost and e.host is trainer.ext_host for e in members.values())
    assert all(not hasattr(e, "trainer") for e in members.values())
    # AEPO holds the rollout service it named, the KL controller its beta control; the sample filter holds neither
    assert isinstance(members["entropy_control"].rollouts, RolloutService)
    assert isinstance(members["kl_control"].beta_control, BetaService)
    assert not hasattr(members["sample_filter"], "rollouts") and not hasattr(members["sample_filter"], "beta_control")
    # and the host reaches none of the services: setting beta, a rollback, a regeneration are not on it
    for name in ("rollouts", "set_beta", "save_checkpoint", "restore_checkpoint", "add_callback", "drop_ratio_clip"):
        assert not hasattr(trainer.ext_host, name), name
    with pytest.raises(AttributeError):
        trainer.ext_host.beta = 0.5  # type: ignore[misc]


def _public(cls) -> set[str]:
    names = {n for klass in cls.__mro__ if klass is not object for n in vars(klass) if not n.startswith("_")}
    return names | {n for n in getattr(cls, "__annotations__", {}) if not n.startswith("_")}


def test_each_service_object_carries_its_protocol_and_nothing_more():
    """What a member may do with an object is what its type says: the host and each service the adapter builds has
    exactly the public names of the protocol it implements (so a member holds no more at run time than mypy allows),
    and the rollout service is its own class."""
    from trl_grpo_ext.adapter import host as adapter
    from trl_grpo_ext.adapter.rollouts import RolloutService
    from trl_grpo_ext.families.base import SERVICES, Host

    built = {
        "beta_control": adapter.BetaService,
        "ratio_clip": adapter.RatioClipService,
        "scoring": adapter.ScoringService,
        "callbacks": adapter.CallbackService,
        "evaluation": adapter.EvaluationService,
        "reference": adapter.ReferenceService,
    }
    assert set(built) | {"rollouts", "monitor_source"} == set(SERVICES)
    assert SERVICES["rollouts"] is RolloutService and SERVICES["monitor_source"] is adapter.MonitorSource
    for name, implementation in built.items():
        assert _public(implementation) == _public(SERVICES[name]), name
    assert _public(adapter.TrainerHost) == _public(Host)


def test_built_in_members_name_the_services_they_use():
    """Every registered member names only known services, and the members whose methods need one name it: the
    regenerating ones the rollouts, the beta controllers beta control; the others none."""
    from trl_grpo_ext.families import FAMILIES
    from trl_grpo_ext.families.base import SERVICES, services_of
    from trl_grpo_ext.families.observers import OBSERVERS

    members = {f"{switch}={name}": reg.get(name) for switch, reg in FAMILIES.items() for name in reg.names()}
    members |= {f"observer={name}": OBSERVERS.get(name) for name in OBSERVERS.names()}
    named = {label: services_of(cls) for label, cls in members.items()}
    assert all(set(services) <= set(SERVICES) for services in named.values()), named
    assert named["entropy_control=aepo"] == ["rollouts"]
    assert named["refill=dynamic_sampling"] == ["rollouts"]
    assert named["kl_control=adaptive"] == named["kl_control=diversity"] == ["beta_control"]
    assert named["token_clip=kl_cov"] == named["token_clip=dppo"] == ["ratio_clip"]
    assert named["advantage_estimator=prm"] == ["scoring"]
    assert named["ref_update=reset"] == ["reference", "callbacks"]
    assert named["observer=collapse_monitor"] == ["monitor_source", "callbacks"]
    assert named["observer=pass_at_k"] == ["evaluation"]
    assert not named["sample_filter=best_of_n"] and not named["token_clip=clip_cov"]


# ---------------------------------------------------------------------------------------------- TRL's private surface
def _trl_owned_names() -> set[str]:
    """Names GRPOTrainer 1.16 defines: its methods and the attributes its __init__ sets."""
    from trl import GRPOTrainer

    methods = {name for name, _ in inspect.getmembers(GRPOTrainer) if name in vars(GRPOTrainer)}
    attributes = set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=", inspect.getsource(GRPOTrainer.__init__)))
    return methods | attributes


def _names_used_on_trl(path: Path, owners=("self", "trainer", "self._trainer")) -> set[str]:
    """Attribute names read or written in ``path`` on the trainer (``self`` in the trainer, ``trainer`` or
    ``self._trainer`` in the host)."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            if ast.unparse(node.value) in owners:
                used.add(node.attr)
    return used


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.parent.name != "adapter")
)
def test_trl_private_names_only_in_the_adapter(module):
    """TRL's private names (read, called or overridden) appear only in the adapter package (trl_grpo_ext/adapter: the
    overrides of TRL's hooks, the host, the rollout service, the plain-TRL source of the monitor, the copies): a TRL
    port touches it alone. Every other module of the package is checked, one by one."""
    from trl_grpo_ext.adapter.compat import TRL_SURFACE

    private = {name for name in TRL_SURFACE if name.startswith("_")}
    tree = ast.parse((PACKAGE / module).read_text())
    touched = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in private}
    touched |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in private}
    assert not touched, f"{module} touches TRL internals {sorted(touched)}"


def test_the_adapter_overrides_the_hooks_and_the_trainer_does_not():
    """The six TRL methods the plugin overrides are defined in ``TRLHooks`` (the adapter) and nowhere in
    ``GRPOExtTrainer``, which reaches them only through its ``ext_*`` methods."""
    from trl_grpo_ext.adapter.compat import OVERRIDDEN_HOOKS
    from trl_grpo_ext.adapter.hooks import TRLHooks
    from trl_grpo_ext.trainer import GRPOExtTrainer

    hooks = set(OVERRIDDEN_HOOKS)
    assert len(hooks) == 6 and hooks == {name for name in vars(TRLHooks) if name.startswith("_") and name[1] != "_"}
    assert hooks <= set(vars(TRLHooks)) and not hooks & set(vars(GRPOExtTrainer))
    assert GRPOExtTrainer.__bases__ == (TRLHooks,)
    # every ext_* method TRLHooks calls is GRPOExtTrainer's own (TRLHooks' stubs raise NotImplementedError)
    called = {name for name in vars(TRLHooks) if name.startswith("ext_")}
    assert called and called <= set(vars(GRPOExtTrainer)), sorted(called - set(vars(GRPOExtTrainer)))


def test_trl_private_surface_is_declared_and_exists(make_trainer):
    """Every GRPOTrainer-defined name the plugin uses is in ``TRL_SURFACE`` (the list a TRL port reviews), and every
    declared name exists on a GRPOTrainer 1.16 instance."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_ext.adapter.compat import TRL_OPTIONAL_SURFACE, TRL_SURFACE
    from trl_grpo_ext.adapter.hooks import TRLHooks
    from trl_grpo_ext.trainer import GRPOExtTrainer

    own = set(vars(GRPOExtTrainer)) | set(vars(TRLHooks))
    own |= {"ext_collectives", "extensions", "ext_host", "ext_rollouts", "ext_clock"}
    used = (_names_used_on_trl(PACKAGE / "trainer.py") & _trl_owned_names()) - own
    used |= (_names_used_on_trl(PACKAGE / "adapter" / "hooks.py") & _trl_owned_names()) - own
    used |= (
        _names_used_on_trl(PACKAGE / "adapter" / "host.py", owners=("self._trainer", "trainer")) & _trl_owned_names()
    )
    rollouts = PACKAGE / "adapter" / "rollouts.py"
    used |= _names_used_on_trl(rollouts, owners=("trainer", "self._trainer")) & _trl_owned_names()
    # CollapseMonitor on a plain GRPOTrainer (the public callback) reads TRL's buffers through the adapter's source
    used |= (
        _names_used_on_trl(PACKAGE / "adapter" / "plain.py", owners=("self.trainer", "trainer")) & _trl_owned_names()
    )
    assert used <= set(TRL_SURFACE), f"undeclared TRL names used: {sorted(used - set(TRL_SURFACE))}"
    trainer = make_trainer(cls=GRPOTrainer, config_cls=GRPOConfig)
    trainer._step = 0  # set by TRL's training loop
    missing = [name for name in TRL_SURFACE if not hasattr(trainer, name)]
    assert not missing, f"TRL {__import__('trl').__version__} lacks {missing}"
    init = inspect.getsource(GRPOTrainer.__init__)
    assert all(f"self.{name} =" in init for name in TRL_OPTIONAL_SURFACE)


# ---------------------------------------------------------------------------------------------- import structure
def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported_from(node: ast.ImportFrom, package: str) -> set[str]:
    """The absolute names a ``from ... import ...`` in ``package`` brings in: the module and each ``module.name``."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return {module} | {f"{module}.{alias.name}" for alias in node.names}


def _module_level_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules imported when ``name`` is executed (not inside functions or ``if TYPE_CHECKING``)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.update(_imported_from(node, package))

    visit(ast.parse(path.read_text()).body)
    return {m for m in found if m in modules and m != name}


def test_no_module_level_import_cycle():
    modules = _modules()
    graph = {name: _module_level_imports(name, path, modules) for name, path in modules.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(name, stack):
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycles.append(" -> ".join([*stack[stack.index(other) :], other]))
            elif other not in state:
                visit(other, [*stack, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles
    # the config runs the selected members' rules (families.check_selection) whatever was imported first; no family
    # module reads the config class (a member's Args fields are checked against the config it is given)
    assert not [
        name for name in graph if name.startswith("trl_grpo_ext.families") and "trl_grpo_ext.config" in graph[name]
    ]
    assert "trl_grpo_ext.callbacks" not in graph["trl_grpo_ext.config"]


def _all_imports(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, at any level (functions included), absolute names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.update(_imported_from(node, package))
    return found


def test_the_library_does_not_import_the_lab():
    """The library (the package ``trl_grpo_ext``, what the wheel ships) imports nothing of the project's lab
    (``grpo_lab``, its own package in the repository's lab/): the lab imports the library and registers its offline
    tasks in the library's registries (``grpo_lab.offline.register``), never the reverse."""
    problems = []
    for name, path in _modules().items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        lab = {m for m in _all_imports(path, package) if m == "grpo_lab" or m.startswith("grpo_lab.")}
        if lab:
            problems.append(f"{name} imports {sorted(lab)}")
    assert not problems, problems
    assert not (PACKAGE / "lab").exists()
    lab_root = PACKAGE.parent / "lab" / "grpo_lab"
    assert {"testbed.py", "testkit.py", "offline.py"} <= {p.name for p in lab_root.glob("*.py")}
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert 'include = ["trl_grpo_ext", "trl_grpo_ext.*"]' in pyproject  # the wheel: the library only


FRESH = [
    "trl_grpo_ext.config",
    "trl_grpo_ext.families.base",
    "trl_grpo_ext.families",
    "trl_grpo_ext.callbacks",
    "trl_grpo_ext.trainer",
    "trl_grpo_ext.core",
]


def test_each_key_module_imports_alone_in_a_fresh_interpreter():
    def run(module):
        return module, subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)

    with ThreadPoolExecutor(2) as pool:
        failures = {m: p.stderr[-2000:] for m, p in pool.map(run, FRESH) if p.returncode != 0}
    assert not failures, failures
    light = subprocess.run(
        [sys.executable, "-c", "import sys, trl_grpo_ext.core; print('trl' in sys.modules)"],
        capture_output=True,
        text=True,
    )
    assert light.stdout.strip() == "False", "the pure core must not import TRL"


def test_the_members_rules_hold_whatever_is_imported_first():
    """The config submodule alone, in a fresh interpreter, runs the selected members' rules (a reference reset with
    beta 0 is a member's rule, not a section's): what is validated does not depend on what was imported first."""
    out = _printed_in_a_fresh_interpreter(
        "from trl_grpo_ext.config import GRPOExtConfig",
        "GRPOExtConfig(output_dir='unused', use_cpu=True, bf16=False, ref_update='reset', ref_reset_steps=1)",
    )
    assert "with beta=0 TRL builds no reference model" in out, out


def test_a_registry_checks_its_members_from_where_it_is_created():
    """Each registry is created with the member contract (``names.member_contract``): registering through the leaf
    ``names`` module, before anything of the families is imported, is checked like any other registration."""
    out = _printed_in_a_fresh_interpreter(
        "import sys\nfrom trl_grpo_ext.names import TOKEN_CLIPS\n"
        "assert 'trl_grpo_ext.families.base' not in sys.modules",
        "TOKEN_CLIPS.register('plain_function')(lambda logps, ctx: logps)",
        "print('registered' if 'plain_function' in TOKEN_CLIPS else 'refused')",
    )
    assert "is not a class derived from trl_grpo_ext.families.Extension" in out, out
    assert out.strip().endswith("refused"), out


def _printed_in_a_fresh_interpreter(setup: str, attempt: str, after: str = "") -> str:
    """What a fresh interpreter prints running ``setup``, then ``attempt`` (its ``ValueError`` printed), then
    ``after``; its stderr where it fails otherwise."""
    code = f"{setup}\ntry:\n    {attempt}\nexcept ValueError as error:\n    print(error)\n{after}\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return run.stdout if run.returncode == 0 else run.stdout + run.stderr[-2000:]


def test_handoff_gives_the_value_to_the_first_inner_call_only():
    """The trainer's two hand-offs between TRL's nested calls: a value exists only while the outer call runs, the
    first inner call takes (or fills) it, later and outside calls get nothing and cannot overwrite it."""
    from trl_grpo_ext.adapter.hooks import HandOff

    handoff = HandOff("outer")
    assert handoff.take() is None
    handoff.put("ignored while closed")
    with handoff.open("ctx") as slot:
        assert handoff.take() == "ctx" and handoff.take() is None  # a member's own forward later in the loss
        assert slot == [None]
    with handoff.open() as slot:
        handoff.put("TRL's scoring")
        handoff.put("a member's scoring inside the same call")
    assert slot == ["TRL's scoring"] and handoff.take() is None
    with handoff.open(), pytest.raises(RuntimeError, match="outer: opened again"):
        with handoff.open():
            pass


def test_handoffs_live_in_the_call_not_on_the_trainer(make_trainer, train_dataset):
    """The trainer carries no hand-off between its calls (no HandOff among its attributes; grep finds no ``_ext_``
    side-channel attribute), and an open hand-off is invisible to another thread (two trainers in two threads)."""
    import threading

    from trl_grpo_ext.adapter.hooks import HandOff

    trainer = make_trainer(token_clip="clip_cov", entropy_control="aepo", aepo_adv_threshold=0.0)
    scored_batch(trainer, train_dataset)
    assert not [name for name, value in vars(trainer).items() if isinstance(value, HandOff)]
    assert not [name for name in vars(trainer) if name.startswith("_ext_")]
    handoff, seen = HandOff("outer"), []
    with handoff.open("main thread's"):
        thread = threading.Thread(target=lambda: seen.append(handoff.take()))
        thread.start()
        thread.join()
        assert handoff.take() == "main thread's"
    assert seen == [None]


def test_the_token_clip_selects_tokens_and_each_slot_runs_only_its_familys_hooks(make_trainer, train_dataset):
    """A token clip returns its selection from ``select_tokens``; the trainer stores it in ``ctx.selected`` for the
    member's other hooks. The trainer calls each slot only through its family's hooks, in the order of the family
    interfaces; a member overriding another family's hook (a second selection) or a retired one (a KL controller's
    loss_scale) is refused at registration, naming the hook and the fix."""
    from trl_grpo_ext.api import FAMILY_INTERFACES
    from trl_grpo_ext.families import KL_CONTROLLERS, SAMPLE_FILTERS
    from trl_grpo_ext.families.contracts import MemberContractError
    from trl_grpo_ext.families.interfaces import KLControllerBase, SampleFilterBase

    trainer = make_trainer(token_clip="kl_cov", kl_cov_ratio=0.2, num_iterations=2, beta=0.0)
    inputs = scored_batch(trainer, train_dataset)
    seen = []
    clip = type(trainer.extensions.token_clip)

    class Watcher(clip):
        def extra_loss(self, ctx):
            seen.append(ctx.selected)
            return super().extra_loss(ctx)

    trainer.extensions["token_clip"] = trainer.ext_build(Watcher)
    trainer._compute_loss(trainer.model, inputs)
    assert seen and seen[0].dtype == torch.bool and bool(seen[0].any())

    with pytest.raises(MemberContractError, match=r"Greedy\.select_tokens is no sample_filter hook.*would never run"):

        @SAMPLE_FILTERS.register("greedy_filter")
        class Greedy(SampleFilterBase):
            def on_generation(self, batch):
                return None

            def select_tokens(self, logps, ctx):
                return torch.ones_like(logps, dtype=torch.bool)

    with pytest.raises(MemberContractError, match=r"Scaling\.loss_scale is no hook since 0\.2\.0.*pf_rescale"):

        @KL_CONTROLLERS.register("scaling_kl")
        class Scaling(KLControllerBase):
            def after_loss(self, ctx):
                pass

            def loss_scale(self, inputs, mode):
                return 0.5

    assert "greedy_filter" not in SAMPLE_FILTERS and "scaling_kl" not in KL_CONTROLLERS
    # the per-hook slot lists are the family interfaces: each family's hook runs, and only there
    from trl_grpo_ext.families.slots import Slots

    slots = Slots()
    for switch in FAMILY_INTERFACES.keys() - {"observer"}:
        slots[switch] = switch  # a stand-in per family, to read where each is called
    slots["watch"] = "observer"
    calls = {
        hook: [member for family, member in slots.having(hook) if family == member]
        for hook in ("on_generation", "modify_logps", "extra_loss", "after_loss")
    }
    for hook, called in calls.items():
        expected = [family for family, face in FAMILY_INTERFACES.items() if hook in face.hooks]
        assert sorted(called) == sorted(expected), hook


@pytest.mark.parametrize("path", sorted((PACKAGE / "config").glob("*.py")), ids=lambda p: p.name)
def test_config_imports_no_behaviour(path):
    """The config package validates against trl_grpo_ext.names (registries, metric names, TRL's loss types), the
    checkpoint rules (trl_grpo_ext.checkpoints, a leaf: what a rollback needs), the members' own rules (the families
    package's ``check_selection``, from ``__init__`` only), the value lists the pure core declares once (its ``Literal``
    types, such as ``core.advantages.StdKind``) and its own section modules, never the monitor or the TRL copies, at
    module level or inside a check."""
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    ours = {name for name in imported if name.startswith(".") or name.startswith("trl_grpo_ext")}
    sections = {f".{p.stem}" for p in (PACKAGE / "config").glob("*.py") if p.stem != "__init__"}
    allowed = {"..names", "..checkpoints"} | sections | ({"..families"} if path.name == "__init__.py" else set())
    core = {name for name in ours if name.startswith("..core.")}
    assert ours - core <= allowed, ours


def test_the_checkpoint_rules_are_a_leaf():
    """trl_grpo_ext.checkpoints (the one scanner of checkpoint folders, read by the config, the trainer and the
    monitor) imports nothing of the package."""
    package = "trl_grpo_ext"
    imported = _all_imports(PACKAGE / "checkpoints.py", package)
    assert not {name for name in imported if name.startswith(package)}, imported


def test_the_family_vocabulary_is_a_leaf():
    """trl_grpo_ext.api (the batch, loss and rollout types, the family Protocols and update types, the hook table,
    the typed registries) imports torch, the pure core and the name constants only, at any level: the adapter, the
    config and the families depend on it, it on none of them."""
    package = "trl_grpo_ext"
    imported = {name for name in _all_imports(PACKAGE / "api.py", package) if name.startswith(package)}
    allowed = {"trl_grpo_ext", "trl_grpo_ext.names"}
    assert all(name in allowed or name.startswith("trl_grpo_ext.core") for name in imported), imported
    third_party = {name.split(".")[0] for name in _all_imports(PACKAGE / "api.py", package)} - {package}
    stdlib = {"__future__", "inspect", "collections", "dataclasses", "types", "typing"}
    assert third_party <= stdlib | {"torch"}, third_party


def test_no_function_level_import_inside_the_families():
    """The families' modules import what they use at module level: none hides an import cycle inside a function
    (the class side of the member contract, the registries' wiring and the estimators a weighting checks included)."""
    hidden = []
    for path in sorted((PACKAGE / "families").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and inner.level > 0:
                        hidden.append(f"{path.name}:{inner.lineno} {ast.unparse(inner)}")
    assert not hidden, hidden


def _args_read_per_class(path: Path) -> dict[str, set[str]]:
    """Config fields each class of a family module reads (``args.X`` / ``self.args.X``; not in ``enabled``,
    ``check_combination`` and ``never_negative_advantages``, which get the whole config)."""
    reads = {}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        found = set()
        for item in node.body:
            # the trainer calls these with the whole config: `enabled`, and the rules run by GRPOExtConfig.validate
            if isinstance(item, ast.FunctionDef) and item.name in (
                "enabled",
                "check_combination",
                "never_negative_advantages",
            ):
                continue
            for sub in ast.walk(item):
                if isinstance(sub, ast.Attribute) and ast.unparse(sub.value) in ("args", "self.args", "self.host.args"):
                    found.add(sub.attr)
        reads[node.name] = found
    return reads


@pytest.mark.parametrize("path", FAMILY_MODULES, ids=[p.name for p in FAMILY_MODULES])
def test_members_declare_every_config_field_they_read(path):
    """Read from the code, branch by branch (the runtime view only catches the branches a test runs): every config
    field a member class reads is a field of its Args (or a base's), and each declared field is a real one."""
    import importlib

    from trl_grpo_ext import GRPOExtConfig
    from trl_grpo_ext.families.base import Extension, args_fields

    package = "trl_grpo_ext.families"
    module = importlib.import_module(package if path.stem == "__init__" else f"{package}.{path.stem}")
    real = {f.name for f in dataclasses.fields(GRPOExtConfig)}
    for name, reads in _args_read_per_class(path).items():
        cls = getattr(module, name)
        if not (isinstance(cls, type) and issubclass(cls, Extension)):
            continue
        declared = args_fields(cls)
        assert reads <= declared, f"{name} reads {sorted(reads - declared)} without declaring them"
        assert declared <= real, f"{name} declares {sorted(declared - real)}, not GRPOExtConfig fields"


def test_a_member_reads_only_the_config_fields_it_declares():
    from trl_grpo_ext import GRPOExtConfig
    from trl_grpo_ext.families.base import Extension, build_member

    class Reader(Extension):
        @dataclasses.dataclass(frozen=True)
        class Args(Extension.Args):
            kl_target: float

        args: Args

    config = GRPOExtConfig(output_dir="x", report_to="none", use_cpu=True, bf16=False, kl_target=0.3)
    member = build_member(Reader, config, host=object(), services={})
    assert member.args.kl_target == 0.3 and type(member.args) is Reader.Args
    assert member.args.use_bias_correction_kl is config.use_bias_correction_kl  # the base's helpers read it
    with pytest.raises(AttributeError, match=r"Reader\.Args has no field 'beta'.*add `beta: <its type>` to"):
        member.args.beta  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        member.args.kl_target = 1.0  # type: ignore[misc]


def _type_words(hint) -> set[str]:
    """A type as a set of plain names: ``Literal['a', 'b']`` reads as ``str`` (a member's Args does not repeat the
    config's value lists), enums deriving from str as ``str``, ``X | None`` as {X, None}."""
    import enum
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_type_words(a) for a in typing.get_args(hint)))
    if origin is typing.Literal:
        return {type(v).__name__ for v in typing.get_args(hint)}
    if hint is type(None):
        return {"None"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum) and issubclass(hint, str):
        return {"str"}
    if origin is not None:
        return {f"{origin.__name__}[{','.join(sorted(w for a in typing.get_args(hint) for w in _type_words(a)))}]"}
    return {getattr(hint, "__name__", str(hint))}


def test_every_members_args_types_its_fields_as_the_config_does():
    """A member's Args repeats the types of the config fields it reads (mypy checks its reads against them): each must
    admit exactly what the config field admits, so the two cannot drift apart."""
    import typing

    from trl_grpo_ext import GRPOExtConfig
    from trl_grpo_ext.families import FAMILIES, registry_for
    from trl_grpo_ext.families.observers import OBSERVERS

    config = {}
    for klass in reversed(GRPOExtConfig.__mro__):
        if dataclasses.is_dataclass(klass):
            config.update(typing.get_type_hints(klass))
    registries = [registry_for(switch) for switch in FAMILIES] + [OBSERVERS]
    members = {registry.get(name) for registry in registries for name in registry.names()}
    checked = 0
    for cls in sorted(members, key=lambda c: c.__qualname__):
        for name, hint in typing.get_type_hints(cls.Args).items():
            words, expected = _type_words(hint), _type_words(config[name])
            if any("SaveStrategy" in w for w in expected):  # transformers' save_strategy: its enum or a string
                expected = {"str"}
            assert words == expected, f"{cls.__qualname__}.Args.{name}: {sorted(words)}; the config: {sorted(expected)}"
            checked += 1
    assert checked > 60
