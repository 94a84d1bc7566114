"""PROBE (stop 55, reverted): held-out windows for the end-aligned best fit; goals CSVs side by side."""
import csv, sys
runs = sys.argv[1:]
def load(d):
    out = {}
    for r in csv.DictReader(open(f"{d}/scheduler_goals.csv")):
        out[(r["seed"], r["trace"], r["load"])] = r
    return out
data = [load(d) for d in runs]
cols = ["delay_vs_easy_sjf", "delay_vs_strongest", "max_vs_easy", "util_vs_easy"]
tot = [0]*len(runs)
for key in data[0]:
    line = [f"{'/'.join(key):22s}"]
    for i, d in enumerate(data):
        r = d[key]
        fails = sum(r[c + "_pass"] == "False" for c in cols)
        tot[i] += fails
        line.append(" ".join(f"{float(r[c]):8.3g}" for c in cols) + f" F{fails}")
    print(" | ".join(line))
print("fails", tot)
