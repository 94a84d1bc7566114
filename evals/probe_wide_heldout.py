"""Probe (stop 57): the goals of the ordering alone on windows the goals table never uses.

`python evals/probe_wide_heldout.py "alibaba:0.5:5:0.8 tiresias:None:0:1.5" POLICY,POLICY`:
each window is trace:days:seed:load; judged against the six baselines run on the same setup."""

import sys
from concurrent.futures import ProcessPoolExecutor

from nightshift.evals import simulate as S

BASE = ["fifo", "easy", "easy-sjf", "easy-sjf-aging", "2d-las", "2d-gittins"]
JUDGED = sys.argv[2].split(",")


def run(args):
    tr, days, seed, load = args
    st = S.make_setups([tr], [load], {tr: days}, None, S.Options(seed=seed))[0]
    out = {}
    for p in BASE + JUDGED:
        m = S.simulate(st, S.POLICIES[p]).metrics
        out[p] = (m["delay_mean_h"], m["delay_max_h"], m["util_useful"])
    return args, out


def goals(out, p):
    mean, mx, ut = out[p]
    strongest = min(out[b][0] for b in BASE)
    r = [
        mean <= 0.9 * out["easy-sjf"][0] + 1e-12,
        mean <= 0.9 * strongest + 1e-12,
        mx <= out["easy"][1] + 1e-9,
        ut >= out["easy"][2] - 1e-9,
    ]
    return r


if __name__ == "__main__":
    wins = [tuple(w.split(":")) for w in sys.argv[1].split()]
    wins = [(t, None if d == "None" else float(d), int(s), float(ld)) for t, d, s, ld in wins]
    tot = {p: 0 for p in JUDGED}
    with ProcessPoolExecutor(2) as ex:
        for args, out in ex.map(run, wins):
            line = [str(args)]
            for p in JUDGED:
                g = goals(out, p)
                tot[p] += 4 - sum(g)
                mean, mx, ut = out[p]
                line.append(
                    f"{p}: {''.join('P' if x else 'F' for x in g)} {mean:.4f}/{mx:.3f}/{ut:.4f}"
                )
            e = out["easy"]
            es = out["easy-sjf"]
            line.append(
                f"easy {e[0]:.4f}/{e[1]:.3f}/{e[2]:.4f} sjf {es[0]:.4f} strongest {min(out[b][0] for b in BASE):.4f}"
            )
            print(" | ".join(line), flush=True)
    print("failed verdicts:", tot)
