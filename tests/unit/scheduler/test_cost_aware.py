"""The cost-aware pause policy: formula table, params, estimates, plan, and its use by the core."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.settings.errors import ConfigError
from services.scheduler.config import load_config
from services.scheduler.core import ReplicaKey, SchedulerCore, Status, Verdict
from services.scheduler.core.model import CapacitySnapshot, Program, ReplicaCapacity
from services.scheduler.core.params import ControlParams
from services.scheduler.core.policies import (
    CostAwarePauseParams,
    PauseContext,
    WorkingSetHooks,
    make_pause_policy,
)
from services.scheduler.core.policies.cost_aware import make_cost_aware_policy
from tests.unit.scheduler.helpers import snapshot
from tests.unit.scheduler.test_properties import check_all, op, params_strategy, run

R = Status.REASONING
A = Status.ACTING
KEY = ReplicaKey("w", 0)


def prog(i: int, tokens: int, status: Status = A, marked: bool = False) -> Program:
    return Program(f"p{i}", "", 0.0, i, status=status, token_total=tokens, marked=marked, replica=KEY)


def policy(**kw):
    return make_pause_policy("cost_aware", CostAwarePauseParams(**kw))


# rho = 10k tok/s, K = 100k, m = tool seconds; r(T) = T/rho * (1 + T/K); phi = min(1, max(T, sigma C) r / (T m)).
@pytest.mark.parametrize(
    "tokens, capacity, tool_s, sigma, phi",
    [
        (2_000, 16_000, 2.0, 0.0, 2_000 / 10_000 * 1.02 / 2.0),  # short context, own KV only: 0.102
        (2_000, 16_000, 2.0, 1.0, 16_000 * 0.2 * 1.02 / (2_000 * 2.0)),  # the whole 16K batch stalls: 0.816
        (2_000, 16_000, 0.5, 1.0, 1.0),  # short tool: hold
        (30_000, 32_000, 1.0, 0.0, 1.0),  # r = 3.9 s > 1 s tool: hold
        (30_000, 32_000, 10.0, 0.0, 3.0 * 1.3 / 10.0),  # long tool: 0.39
        (30_000, 200_000, 10.0, 1.0, 1.0),  # big pool: hold
        (0, 16_000, 2.0, 0.0, 1.0),  # nothing to weigh
    ],
)
def test_hold_fraction_table(tokens, capacity, tool_s, sigma, phi):
    p = policy(prefill_tokens_per_s=10_000, prefill_quadratic_tokens=100_000, tool_seconds=tool_s, stall_share=sigma)
    assert p.hold_fraction(tokens, capacity) == pytest.approx(phi)


# phi = 0.102 for a 2K context with 2 s tools (first row above).
@pytest.mark.parametrize(
    "status, scale_reasoning, phi_min, raw, weight",
    [
        (A, True, 0.0, 2_000, math.floor(2_000 * 0.102)),
        (A, False, 0.0, 2_000, math.floor(2_000 * 0.102)),
        (A, True, 0.0, 1_000, math.floor(1_000 * 0.102)),  # acting_token_weight 0.5: phi scales the raw weight
        (R, True, 0.0, 2_000, math.floor(2_000 * 0.102)),
        (R, False, 0.0, 2_000, 2_000),
        (A, True, 0.1, 2_000, math.floor(2_000 * 0.102)),  # at or above phi_min: counted
        (A, True, 0.2, 2_000, 0),  # below phi_min: let go
        (A, True, 1.0, 2_000, 0),  # the default: binary
        (R, True, 1.0, 2_000, 0),
        (R, False, 1.0, 2_000, 2_000),
    ],
)
def test_weight_tokens_table(status, scale_reasoning, phi_min, raw, weight):
    p = policy(
        prefill_tokens_per_s=10_000,
        prefill_quadratic_tokens=100_000,
        tool_seconds=2.0,
        stall_share=0.0,
        scale_reasoning=scale_reasoning,
        min_hold_fraction=phi_min,
    )
    assert p.weight_tokens(prog(0, 2_000, status), raw, 16_000) == weight


@pytest.mark.parametrize(
    "tokens, capacity, weight",
    [
        (2_000, 64_000, 2_000),  # r(2K) = 0.11 s >= (2K / 64K) * 2 s = 0.06 s: held
        (2_000, 8_000, 0),  # r(2K) = 0.11 s < (2K / 8K) * 2 s = 0.5 s: let go
        (30_000, 64_000, 30_000),  # r(30K) = 2.3 s >= (30K / 64K) * 2 s = 0.94 s: held
        (30_000, 32_000, 30_000),  # r(30K) = 2.3 s >= 1.9 s: held
    ],
)
def test_default_rule_holds_a_context_iff_recompute_outlasts_its_share_of_the_tool(tokens, capacity, weight):
    # Defaults: rho 18k tok/s, K 77k, the whole batch stalls (sigma 1), phi_min 1; tool prior 2 s.
    # Hold iff r(T) >= (T / C) * m.
    assert make_pause_policy("cost_aware").weight_tokens(prog(0, tokens), tokens, capacity) == weight


def test_own_kv_only_lets_go_what_the_batch_rule_holds():
    # sigma 0 (the paper's c^2 space-time) compares r(T) with the whole tool time: r(2K) = 0.11 s < 2 s.
    own = make_pause_policy("cost_aware", CostAwarePauseParams(stall_share=0.0))
    assert own.weight_tokens(prog(0, 2_000), 2_000, 64_000) == 0
    assert own.weight_tokens(prog(0, 30_000), 30_000, 64_000) == 30_000


@pytest.mark.parametrize(
    "field, value",
    [
        ("prefill_tokens_per_s", 0.0),
        ("prefill_tokens_per_s", float("nan")),
        ("prefill_quadratic_tokens", -1.0),
        ("tool_seconds", 0.0),
        ("stall_share", 1.5),
        ("stall_share", -0.1),
        ("prior_observations", 0.0),
        ("half_life_observations", 0.0),
        ("tool_seconds", True),
        ("min_hold_fraction", 1.1),
    ],
)
def test_params_refuse_invalid_values_naming_the_field(field, value):
    with pytest.raises(ConfigError) as info:
        CostAwarePauseParams(**{field: value})
    assert info.value.field == field


def test_flags_and_env_reach_the_params_and_errors_name_the_flag():
    cfg = load_config(
        ["--pause-policy", "cost_aware", "--cost-aware-stall-share", "0.25"],
        {"BANDMASTER_SCHEDULER_COST_AWARE_TOOL_SECONDS": "1.5"},
    )
    assert cfg.pause_policy_params() == CostAwarePauseParams(stall_share=0.25, tool_seconds=1.5)
    assert load_config(["--pause-policy", "threshold"], {}).pause_policy_params() is None
    assert load_config([], {}).pause_policy_params() == CostAwarePauseParams()  # the service default
    with pytest.raises(ConfigError) as info:
        load_config(["--cost-aware-stall-share", "2"], {})
    assert info.value.field == "cost_aware_stall_share"


def test_estimates_start_at_the_priors_and_move_only_on_refresh():
    p = policy(
        prefill_tokens_per_s=10_000,
        prefill_quadratic_tokens=1e12,
        tool_seconds=2.0,
        prior_observations=2.0,
        half_life_observations=1e12,
    )
    assert not p.refresh()
    p.observe_tool(5.0)
    p.observe_tool(5.0)
    p.observe_prefill(20_000, 0.5)  # 40k tok/s
    p.observe_prefill(100, 10.0)  # too small to say anything: ignored
    assert (p.tool_seconds, p.prefill_tokens_per_s) == (2.0, 10_000)
    p.refresh()  # (True only if a weight may have changed: nothing has been weighed)
    assert not p.refresh()  # nothing observed since
    assert p.tool_seconds == pytest.approx((2 * 2.0 + 10.0) / 4)
    # The 90th percentile of {prior, prior, 40k} (quadratic knee 1e12: the rate is ~u / ttft).
    assert p.prefill_tokens_per_s == pytest.approx(40_000)
    for _ in range(20):
        p.observe_prefill(20_000, 0.5)
    p.refresh()
    assert p.prefill_tokens_per_s == pytest.approx(40_000)


def test_queueing_does_not_read_as_slow_prefill():
    """Under load most turns queue before their prefill; the estimate follows the fast ones."""
    p = policy(prefill_tokens_per_s=10_000, prefill_quadratic_tokens=1e12, prior_observations=8.0)
    for i in range(200):
        queued_s = 0.0 if i % 5 == 0 else 3.0 + i % 7  # 80% of the turns waited seconds in the queue
        p.observe_prefill(4_000, 0.2 + queued_s)  # true rate: 20k tok/s
    p.refresh()
    assert p.prefill_tokens_per_s == pytest.approx(20_000)


def test_plan_skips_acting_programs_that_do_not_count():
    p = policy()
    programs = [prog(0, 1_000), prog(1, 5_000), prog(2, 3_000), prog(3, 4_000, R)]
    weights = {"p0": 0, "p1": 5_000, "p2": 3_000, "p3": 4_000}
    ctx = PauseContext(KEY, programs, 12_400, 8_000, 1, None, 100, lambda q: weights[q.session_id], 0.0)
    plan = p.plan(ctx)
    assert plan.pause == ("p2", "p1")  # shortest first among those that count; p0 is already let go
    assert plan.mark == ()


def test_threshold_has_no_hooks_and_cost_aware_has_them():
    assert not isinstance(make_pause_policy("threshold"), WorkingSetHooks)
    assert isinstance(make_pause_policy("cost_aware"), WorkingSetHooks)


def _core(**kw) -> SchedulerCore:
    core = SchedulerCore(ControlParams(), policy(**kw))
    core.tick(0.0, snapshot({("w", 0): 16_000}))
    return core


def test_cheap_contexts_neither_hold_admission_nor_get_paused():
    # 2K contexts, 2 s tools, 18k tok/s, own KV only: phi ~ 0.06, so 12 programs (24K raw) fit in 16K.
    core = _core(stall_share=0.0)
    for i in range(12):
        result = core.admit(0.0, f"p{i}", "", 2_000, f"r{i}")
        assert result.decision.verdict is Verdict.PLACED
        core.complete(0.5, f"p{i}", f"r{i}", result.decision.replica, 2_000, 100)
    tick = core.tick(5.0)
    assert tick.paused == 0 and core.paused_ids() == ()
    core.ledger.check_invariants(5.0)


def test_expensive_contexts_get_the_reference_treatment():
    # 6K contexts in a 16K budget with the whole batch stalling: phi = 1, as the threshold policy.
    ca, th = _core(stall_share=1.0, tool_seconds=0.5), SchedulerCore(ControlParams())
    th.tick(0.0, snapshot({("w", 0): 16_000}))
    for core in (ca, th):
        verdicts = []
        for i in range(3):
            result = core.admit(0.0, f"p{i}", "", 6_000, f"r{i}")
            verdicts.append(result.decision.verdict)
            if result.decision.verdict is Verdict.PLACED:
                core.complete(0.5, f"p{i}", f"r{i}", result.decision.replica, 6_000, 100)
        assert verdicts == [Verdict.PLACED, Verdict.PLACED, Verdict.WAIT]
    assert ca.stats(1.0).replicas[0].used_tokens == th.stats(1.0).replicas[0].used_tokens


def test_the_core_feeds_tool_times_and_ttft_and_recharges_on_refresh():
    core = _core(stall_share=0.0, prior_observations=1.0, half_life_observations=1e12, min_hold_fraction=0.0)
    result = core.admit(0.0, "p", "", 2_000, "r0")
    core.complete(1.0, "p", "r0", result.decision.replica, 2_000, 100, cached_tokens=0, ttft_s=0.05)
    before = core.stats(1.0).replicas[0].used_tokens
    core.admit(11.0, "p", "", 2_200, "r1")  # a 10 s tool call ended
    core.complete(12.0, "p", "r1", KEY, 2_200, 100, cached_tokens=2_100)  # no ttft: no prefill sample
    p = core.policy
    assert p.tool_seconds == 2.0  # not folded in before the tick
    core.tick(15.0)
    assert p.tool_seconds == pytest.approx((2.0 + 10.0) / 2)
    # One sample beside one prior pseudo-observation: the upper of the two.
    assert p.prefill_tokens_per_s == pytest.approx(max(18_000, 2_000 * (1 + 2_000 / 77_000) / 0.05))
    core.ledger.check_invariants(15.0)
    assert core.stats(15.0).replicas[0].used_tokens < before  # longer tools: worth holding less


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    params_strategy,
    st.lists(op, max_size=40),
    st.sampled_from([0.0, 0.5, 1.0]),
    st.booleans(),
    st.sampled_from([0.0, 0.5, 1.0]),
)
def test_invariants_hold_under_random_operations(params, ops, sigma, scale_reasoning, phi_min):
    core = SchedulerCore(
        params,
        policy(
            stall_share=sigma,
            scale_reasoning=scale_reasoning,
            tool_seconds=3.0,
            prior_observations=1.0,
            min_hold_fraction=phi_min,
        ),
    )
    run(core, ops, check_all)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params_strategy, st.lists(op, max_size=40))
def test_with_every_context_worth_holding_it_is_the_threshold_policy(params, ops):
    # Tools of ~0 s make phi = 1 for every program: every decision must match the reference's.
    seen = {"threshold": [], "cost_aware": []}

    def record(name):
        def check(kind, core, now, result, before):
            seen[name].append((kind, result))

        return check

    run(SchedulerCore(params, make_pause_policy("threshold")), ops, record("threshold"))
    run(SchedulerCore(params, policy(tool_seconds=1e-9, prior_observations=1e12)), ops, record("cost_aware"))
    assert seen["threshold"] == seen["cost_aware"]


# -- workers without cache reports (capacity's DEGRADATION_CACHE_REPORT_OFF) ---------------------------------

W0, W1 = ReplicaKey("w0", 0), ReplicaKey("w1", 0)


def _fleet(core: SchedulerCore, unreported: set[str], version: int = 1):
    """Two 64K replicas; those in `unreported` report no cached tokens."""
    replicas = tuple(ReplicaCapacity(w, 0, 65_536, cache_report=w not in unreported) for w in ("w0", "w1"))
    return core.apply_capacity(0.0, CapacitySnapshot(version, replicas))


@pytest.mark.parametrize(
    "unreported, ran_on, learns",
    [
        (set(), W0, True),
        ({"w0"}, W0, False),  # its cached_tokens of 0 means "not reported"
        ({"w0"}, W1, True),  # the replicas that report still teach the rate
        ({"w0"}, None, False),  # where it ran is unknown and some replica does not report
        (set(), None, True),
        ({"w0", "w1"}, W1, False),
    ],
)
def test_prefill_is_learnt_only_from_turns_whose_cached_tokens_are_reported(unreported, ran_on, learns):
    core = SchedulerCore(ControlParams(), policy(prior_observations=1.0))
    _fleet(core, unreported)
    core.admit(0.0, "p", "", 2_000, "r0")
    core.complete(1.0, "p", "r0", ran_on, 2_000, 100, cached_tokens=0, ttft_s=0.01)
    core.tick(5.0)
    assert (core.policy.prefill_tokens_per_s > 18_000) is learns
    assert core.cache_reported(ran_on) is learns


def test_turns_without_cache_reports_no_longer_teach_a_far_too_fast_prefill():
    """Regression (issue 20): a worker without --enable-cache-report sends cached_tokens 0 for prompts that
    were mostly cached; taking them as uncached learnt a prefill rate ~20x too fast, recompute looked cheap
    and the policy held nothing (44% cached live instead of 81%)."""
    core = SchedulerCore(ControlParams(), policy())
    effects = _fleet(core, {"w0"})
    assert [r.message for r in effects.logs if "cache_report_off" in r.message] == [
        "scheduler.capacity cache_report_off worker=w0 dp_rank=0: its turns no longer feed the prefill-rate estimate"
    ]
    # 20K-token contexts of which 19K were cached: the true prefill of 1K tokens at 18K tok/s takes 56 ms.
    now = 0.0
    for turn in range(40):
        core.admit(now, "p", "", 20_000, f"r{turn}")
        core.complete(now + 0.1, "p", f"r{turn}", W0, 20_000, 100, cached_tokens=0, ttft_s=1_000 / 18_000)
        now += 1.0
    core.tick(now)
    assert core.policy.prefill_tokens_per_s == 18_000  # the prior, not ~470K tok/s
    # So a 20K context on a 64K pool with 2 s tools is worth holding: r(T) = 1.4 s >= (T / C) * m = 0.61 s.
    assert core.policy.hold_fraction(20_000, 65_536) == 1.0
    # The worker restarted with the flag: its turns teach the rate again, and the change is logged once.
    effects = _fleet(core, set(), version=2)
    assert [r.message for r in effects.logs if "cache_report" in r.message] == [
        "scheduler.capacity cache_report_on worker=w0 dp_rank=0: its turns feed the prefill-rate estimate"
    ]
    assert not [r for r in _fleet(core, set(), version=3).logs if "cache_report" in r.message]


def test_a_replica_that_leaves_the_snapshot_is_not_said_to_report_again():
    core = SchedulerCore(ControlParams(), policy())
    _fleet(core, {"w0"})
    gone = core.apply_capacity(0.0, CapacitySnapshot(2, (ReplicaCapacity("w1", 0, 65_536),)))
    assert not [r for r in gone.logs if "cache_report" in r.message]
    assert core.cache_reported(None)  # every replica left reports


def reference_weight(policy_: object, program: Program, raw: int, capacity: int) -> int:
    """w(p) as the formula reads: phi for this size and budget, then the hold rule."""
    phi = policy_.hold_fraction(program.token_total, capacity)  # type: ignore[attr-defined]
    phi_min = policy_.params.min_hold_fraction  # type: ignore[attr-defined]
    return math.floor(raw * phi) if phi >= phi_min else 0


@pytest.mark.parametrize("sigma", [1.0, 0.3, 0.0])
@pytest.mark.parametrize("quadratic", [77_000.0, 5_000.0, 1e9])
def test_the_binary_rule_threshold_weighs_every_size_as_the_formula(sigma: float, quadratic: float):
    """Under the binary rule the policy compares a size with the smallest size held on that budget
    (found by bisection) instead of computing phi: the same weight for every size, at the threshold,
    next to it and far from it, as the estimates move."""
    p = make_pause_policy("cost_aware", CostAwarePauseParams(stall_share=sigma, prefill_quadratic_tokens=quadratic))
    thresholds = set()
    estimates = ((2.0, 18_000.0), (10.0, 18_000.0), (3.0, 20_000.0), (60.0, 10_000.0), (9.3, 4_100.0), (1e-4, 9e4))
    for tool_s, rho in estimates:
        p.tool_seconds, p.prefill_tokens_per_s = tool_s, rho  # type: ignore[attr-defined]
        for capacity in (40_000, 131_072, 1_000_003):
            threshold = p._smallest_held(capacity)  # type: ignore[attr-defined]
            thresholds.add(threshold)
            sizes = set(range(0, 200_000, 997)) | set(range(max(0, threshold - 300), threshold + 300))
            for tokens in sorted(sizes):
                for status, raw in ((A, tokens), (A, tokens // 2), (R, tokens)):
                    q = prog(0, tokens, status)
                    assert p.weight_tokens(q, raw, capacity) == reference_weight(p, q, raw, capacity), (
                        tokens,
                        capacity,
                        tool_s,
                    )
    assert len(thresholds) >= 4  # sizes held from many different thresholds (some: all, some: none)


def test_the_threshold_search_from_any_start_finds_the_same_size():
    p = make_pause_policy("cost_aware")
    for tool_s, rho, capacity in ((10.0, 18_000.0, 131_072), (60.0, 10_000.0, 40_000), (2.0, 18_000.0, 131_072)):
        p.tool_seconds, p.prefill_tokens_per_s = tool_s, rho  # type: ignore[attr-defined]
        exact = p._smallest_held(capacity)  # type: ignore[attr-defined]
        for near in (1, 2, exact - 1000, exact - 1, exact, exact + 1, exact + 5_000, 10**9):
            assert p._smallest_held(capacity, near) == exact, (near, exact)  # type: ignore[attr-defined]


def test_a_refresh_that_moves_no_threshold_reports_no_weight_change():
    """Under the binary rule the weights change only with a budget's threshold: a refresh whose
    estimates move no threshold weighed so far says so, and one that moves one says so too."""
    p = make_pause_policy("cost_aware")
    q = prog(0, 100_000)
    p.weight_tokens(q, 100_000, 131_072)  # weighs on this budget: its threshold now counts
    before = p._hold_threshold(131_072)  # type: ignore[attr-defined]
    p.observe_tool(2.0)  # the prior's own mean: the estimate barely moves
    assert p.refresh() is False and p._hold_threshold(131_072) == before  # type: ignore[attr-defined]
    for _ in range(40):
        p.observe_tool(40.0)  # long tools: recompute is cheaper for more sizes
    assert p.refresh() is True and p._hold_threshold(131_072) > before  # type: ignore[attr-defined]
    smooth = make_pause_policy("cost_aware", CostAwarePauseParams(min_hold_fraction=0.5))
    smooth.weight_tokens(q, 100_000, 131_072)  # type: ignore[attr-defined]
    smooth.observe_tool(2.0)  # type: ignore[attr-defined]
    assert smooth.refresh() is True  # type: ignore[attr-defined]  # smooth weights move with any estimate


@pytest.mark.parametrize(
    "params",
    [
        CostAwarePauseParams(),  # the binary rule
        CostAwarePauseParams(scale_reasoning=False),
        CostAwarePauseParams(min_hold_fraction=0.5),  # smooth weights
        CostAwarePauseParams(min_hold_fraction=0.5, scale_reasoning=False, tool_seconds=30.0),
    ],
)
def test_the_weigher_on_a_budget_weighs_as_weight_tokens(params: CostAwarePauseParams):
    """`weigher(C)` is `weight_tokens(·, ·, C)` for the estimates of when it was asked for (None: the
    raw weight), on every size, status and budget (the resume plan weighs each candidate with it)."""
    rng = random.Random(5)
    policy = make_cost_aware_policy(params)
    for round_ in range(4):
        for budget in (5_000, 200_000, 1_900_000, 50_000_000, rng.randrange(1_000, 3_000_000)):
            weigh = policy.weigher(budget)
            for _ in range(300):
                status = rng.choice([Status.ACTING, Status.REASONING])
                program = Program("p", "", 0.0, 0, status=status, token_total=rng.randrange(0, 150_000))
                raw = rng.randrange(0, program.token_total + 1)
                # None: the raw weight, for every program on that budget
                assert (raw if weigh is None else weigh(program, raw)) == policy.weight_tokens(program, raw, budget)
        for _ in range(20):  # the estimates move between rounds: a new weigher follows them
            policy.observe_tool(rng.uniform(0.1, 60.0 * (round_ + 1)))
        policy.refresh()
