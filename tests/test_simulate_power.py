"""GPU power in the simulator (issue 31): busy GPUs draw the power model's watts, and the capping
policies run cost-sensitive jobs at a lower limit while the price is in its peak band, slower by
the model's throughput, never an urgent job and never one whose deadline the cap would break."""

from __future__ import annotations

import math

from sim_setups import hand_setup

from nightshift.evals import simulate as S
from nightshift.runtime.scheduling.power_model import power_model

H = 3600.0
V100 = power_model("V100")
FULL_W = V100.busy_watts(V100.default_w)


def cap_reading():
    """The capping policies' limit (the model's least energy per unit of work) on a V100."""
    limit = S.POLICIES["nightshift-cap"].cap_at_peak_w
    assert limit == S.POLICIES["nightshift-caponly"].cap_at_peak_w == S.CAP_W
    return V100.at(limit)


PEAK = (17 * H, 21 * H)  # the simulation tariff's peak band, on the setup's first day


def run(setup: S.Setup, policy: str) -> tuple[S._Run, S.RunResult]:
    r = S._Run(setup, S.POLICIES[policy])
    return r, r.run()


def kwh(watts: float, seconds: float, gpus: float = 1.0) -> float:
    return gpus * watts * seconds / 3.6e6


def test_uncapped_energy_is_gpus_times_share_times_the_models_busy_watts_times_time():
    """Every busy segment of an uncapped run draws the V100's busy watts at its default limit
    (220.25 W from Zeus' measurements, not a flat 300 W), and the run's energy is their sum; on a
    hand trace without pauses that is Σ GPUs x share x watts x run time of the jobs."""
    setup = S.make_setups(["alibaba"], [1.0], {"alibaba": 0.25}, None, S.Options())[0]
    r, res = run(setup, S.NIGHTSHIFT)  # tariff pauses: several segments per job; shared GPUs
    assert r.segments and all(w == FULL_W for *_, w in r.segments)
    want = sum(kwh(FULL_W, b - a, g) for a, b, g, _ in r.segments)
    assert math.isclose(res.metrics["energy_kwh"], want, rel_tol=1e-12)
    assert any(g != int(g) for _, _, g, _ in r.segments)  # shared GPUs count by their share

    jobs = [(0.0, 2 * H, 2, False, 100 * H), (H, 3 * H, 1, True, 100 * H)]
    _, res = run(hand_setup(jobs, [4]), "easy")
    assert math.isclose(res.metrics["energy_kwh"], kwh(FULL_W, 2 * H, 2) + kwh(FULL_W, 3 * H))
    # the floors price the same uncapped watts
    floor, _ = S.energy_floors(hand_setup(jobs, [4]))
    assert floor > 0 and S.uncapped_watts(S.Options()) == FULL_W


def test_a_capped_job_runs_slower_during_peak_only_and_draws_less_energy_per_unit_of_work():
    """A cost-sensitive 6-h job from 16:00: 1 h at full power, the 4 peak hours at the cap (4 x
    throughput hours of work), the rest from 21:00 at full power; a 2-h job in the morning is not
    touched. The capped job ends 4 x (1 - throughput) h later than uncapped and spends less
    energy on the same work."""
    CAP = cap_reading()
    jobs = [(8 * H, 2 * H, 1, True, 100 * H), (16 * H, 6 * H, 1, True, 100 * H)]
    r, res = run(hand_setup(jobs, [2]), "nightshift-caponly")
    twin, twin_res = run(hand_setup(jobs, [2]), S.NOTARIFF)
    peak_s = PEAK[1] - PEAK[0]
    assert twin.jobs[2].done == 22 * H and twin.jobs[1].done == 10 * H
    assert math.isclose(r.jobs[2].done, PEAK[1] + 5 * H - peak_s * CAP.throughput)
    assert math.isclose(r.jobs[2].done - twin.jobs[2].done, peak_s * (1 - CAP.throughput))
    assert r.jobs[1].done == 10 * H and not r.jobs[1].capped  # outside the peak: full speed
    assert r.jobs[2].capped and res.metrics["capped"] == 1
    capped = kwh(FULL_W, H) + kwh(CAP.watts, peak_s) + kwh(FULL_W, r.jobs[2].done - PEAK[1])
    assert math.isclose(res.metrics["energy_kwh"], capped + kwh(FULL_W, 2 * H))
    assert res.metrics["energy_kwh"] < twin_res.metrics["energy_kwh"]  # the same work done
    # per unit of work inside the peak: watts / throughput under the cap, below full power's
    assert CAP.watts / CAP.throughput < FULL_W
    # the segments: the cap's watts from 17:00 to 21:00 exactly, full power around them
    segs = sorted((a, b, w) for a, b, _, w in r.segments if a >= 16 * H)
    assert segs == [
        (16 * H, PEAK[0], FULL_W),
        (*PEAK, CAP.watts),
        (PEAK[1], r.jobs[2].done, FULL_W),
    ]


def test_an_urgent_job_is_never_capped():
    """The same 6-h job across the peak, urgent: full speed and full power under both capping
    policies (nightshift-cap also holds cost-sensitive work; an urgent job is never held)."""
    jobs = [(16 * H, 6 * H, 1, False, 100 * H)]
    for policy in ("nightshift-cap", "nightshift-caponly"):
        r, res = run(hand_setup(jobs, [1]), policy)
        assert r.jobs[1].done == 22 * H and not r.jobs[1].capped, policy
        assert math.isclose(res.metrics["energy_kwh"], kwh(FULL_W, 6 * H))


def test_a_job_whose_deadline_the_cap_would_break_is_not_capped():
    """A cost-sensitive 6-h job from 16:00 ends at 22:00 uncapped and about 22:37 capped: with
    its deadline at 22:18 it runs uncapped and meets it; at 23:00 it is capped and meets it too."""
    CAP = cap_reading()
    capped_end = PEAK[1] + 5 * H - (PEAK[1] - PEAK[0]) * CAP.throughput
    assert 22.3 * H < capped_end < 23 * H
    tight = [(16 * H, 6 * H, 1, True, 22.3 * H)]
    r, res = run(hand_setup(tight, [1]), "nightshift-caponly")
    assert r.jobs[1].done == 22 * H and not r.jobs[1].capped and res.metrics["deadline_misses"] == 0
    loose = [(16 * H, 6 * H, 1, True, 23 * H)]
    r, res = run(hand_setup(loose, [1]), "nightshift-caponly")
    assert r.jobs[1].capped and math.isclose(r.jobs[1].done, capped_end)
    assert res.metrics["deadline_misses"] == 0


def test_misses_caused_by_the_cap_are_those_its_twin_without_the_cap_meets():
    """nightshift-cap missed jobs 1 and 2 after capping them and 3 uncapped; nightshift (its
    `cap_twin`) missed 2: the cap caused one miss. nightshift-caponly is judged against
    nightshift-notariff, which missed none of its capped misses."""
    assert S.POLICIES["nightshift-cap"].cap_twin == S.NIGHTSHIFT
    assert S.POLICIES["nightshift-caponly"].cap_twin == S.NOTARIFF

    def result(policy: str, missed: set[int], capped: set[int]) -> S.RunResult:
        metrics = {"cost": 1.0, "cost_floor": 0.5, "cost_floor_deadline": 0.6}
        return S.RunResult(
            "hand",
            0.8,
            policy,
            metrics,
            [],
            [],
            {},
            frozenset(missed),
            capped_missed=frozenset(capped),
        )

    runs = [
        result("nightshift-cap", {1, 2, 3}, {1, 2}),
        result(S.NIGHTSHIFT, {2}, set()),
        result("nightshift-caponly", {4}, {4}),
        result(S.NOTARIFF, set(), set()),
    ]
    S.add_shares(runs)
    assert [r.metrics["cap_misses_caused"] for r in runs] == [1, 0, 1, 0]
    # all the misses its uncapped twin meets, capped or not: 1 and 3 for nightshift-cap
    assert runs[0].metrics["misses_vs_cap_twin"] == 2 and runs[2].metrics["misses_vs_cap_twin"] == 1
    assert math.isnan(runs[1].metrics["misses_vs_cap_twin"])


def test_a_gpu_type_without_a_model_or_a_cap_outside_its_range_is_refused_by_name(capsys):
    """--gpu-type names the GPU the traces are declared to run on: one the power model does not
    know, or one whose range the capping policies' 150 W falls outside, is a clear error."""
    for argv, want in (
        (["--gpu-type", "T4", "--quick"], "no power model for 'T4'"),
        (["--gpu-type", "H100", "--quick", "--policies", "nightshift-cap"], "outside the H100"),
    ):
        try:
            S.main(argv)
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
        err = capsys.readouterr().err
        assert "--gpu-type" in err and want in err and "Traceback" not in err
