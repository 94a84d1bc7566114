"""Held-out check of the end-aligned best fit: windows and loads the goals table never uses."""
import dataclasses, sys, itertools
from concurrent.futures import ProcessPoolExecutor
import nightshift.evals.simulate as S
from nightshift.runtime.scheduling import placement

DAYS = {"philly": 7.0, "alibaba": 14.0, "pollux": 1.0, "tiresias": None}
def unit(args):
    trace, load, seed, align, gph = args
    placement._ALIGN = align
    opts = S.Options(seed=seed)
    (setup,) = S.make_setups([trace], [load], {trace: DAYS[trace]}, gph, opts)
    r = S.simulate(setup, "nightshift-notariff")
    m = r.metrics
    return (trace, load, seed, gph, align, m["delay_mean_h"], m["delay_max_h"], m["util_useful"], m["idle_waiting"], m["jobs"])

if __name__ == "__main__":
    seeds = [int(s) for s in sys.argv[1].split(",")]
    loads = [float(x) for x in sys.argv[2].split(",")]
    traces = sys.argv[3].split(",")
    gph = int(sys.argv[4]) if len(sys.argv) > 4 else None
    units = [(t, l, s, a, gph) for t in traces for l in loads for s in seeds for a in (0, 1)]
    with ProcessPoolExecutor(2) as ex:
        res = list(ex.map(unit, units))
    print("trace load seed gph | mean0 mean1 | max0 max1 | util0 util1 | idle0 idle1")
    agg = {"mean": [0, 0, 0], "max": [0, 0, 0], "util": [0, 0, 0]}
    for a, b in zip(res[::2], res[1::2]):
        print(*a[:4], f"| {a[5]:.4g} {b[5]:.4g} | {a[6]:.4g} {b[6]:.4g} | {a[7]:.4f} {b[7]:.4f} | {a[8]:.4f} {b[8]:.4f}")
        for k, i, better in (("mean", 5, lambda x, y: y < x * 0.999), ("max", 6, lambda x, y: y < x * 0.999), ("util", 7, lambda x, y: y > x + 1e-6)):
            worse = (lambda x, y: y > x * 1.001) if k != "util" else (lambda x, y: y < x - 1e-6)
            agg[k][0 if better(a[i], b[i]) else 1 if worse(a[i], b[i]) else 2] += 1
    print("better/worse/same with alignment:", agg)
