"""A/B of two builds of fastpipe on one machine (before and after a refactor): the loader and images suites
in alternating rounds, each run with one tree first on PYTHONPATH, so that drift of the machine falls on
both. The table compares fastpipe's rates and, steadier, its ratios to the baselines measured in the same
run (index_select on the mapped tensor, the single-thread gather bound, DataLoader + PIL).

usage: python benchmarks/ab_builds.py OLD_TREE NEW_TREE [--rounds 3] [--pairs 8] [--out-dir DIR] [--data-dir DIR]
(each tree a checkout with its extension built in place, e.g. `python setup.py build_ext --inplace`)

The suites' image rows time 3 short repetitions of 400 images each, too few to tell builds apart within
~15%; --pairs then times the images suite's fastpipe ImageFolder row alone (RRC 224, batch 64, 2 threads,
the same corpus) in that many alternating old/new process pairs, the median of 4 passes each.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

LOADER = ["loader", "--only", "cifar,imagenet,tokens", "--no-overlap", "--reps", "3"]
IMAGES = ["images", "--loaders", "fastpipe_folder,fastpipe_recipe,dl_pil", "--corpora", "jpeg", "--sizes", "224",
          "--cache", "warm", "--reps", "3", "--images", "400"]


FOLDER_PASSES = """
import sys, time, fastpipe
from fastpipe.transforms import RandomResizedCrop
ld = fastpipe.Loader(fastpipe.ImageFolder(sys.argv[1]), batch_size=64, shuffle=True, num_threads=2,
                     transforms={0: RandomResizedCrop(224)})
for _ in ld:
    pass
rates = []
for _ in range(4):
    t0 = time.perf_counter()
    n = sum(len(b[0]) for b in ld)
    rates.append(n / (time.perf_counter() - t0))
print(sorted(rates)[2])
"""


def folder_rate(tree, corpus):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, "-c", FOLDER_PASSES, corpus], env=env, check=True, capture_output=True,
                         text=True, cwd=tree).stdout
    return float(out.split()[-1])


def run(tree, suite_args, out, data_dir):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, "-m", "fastpipe.bench", *suite_args, "--out", out, "--data-dir", data_dir,
           "--no-progress"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=tree)
    with open(out) as f:
        return json.load(f)["results"]


def rate(loader):
    """Median samples per second of a loader's runs alone."""
    return statistics.median(r["samples"] / r["seconds"] for r in loader["alone_reps"])


def loader_figures(results):
    out = {}
    for name, ds in results["datasets"].items():
        ls = ds["loaders"]
        fp = rate(ls["fastpipe"])
        out[f"{name} fastpipe (samples/s)"] = fp
        for base in ("index_select", "bound"):
            if base in ls and not ls[base].get("error"):
                out[f"{name} fastpipe / {base}"] = fp / rate(ls[base])
    return out


def images_figures(results):
    rows = results["corpora"]["jpeg"]["rows"]["224_warm"]
    out = {f"jpeg {k} (img/s)": rows[k]["images_per_s"] for k in ("fastpipe_folder", "fastpipe_recipe")}
    for k in ("fastpipe_folder", "fastpipe_recipe"):
        out[f"jpeg {k} / dl_pil"] = rows[k]["images_per_s"] / rows["dl_pil"]["images_per_s"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--out-dir", default="/tmp/fastpipe-ab")
    p.add_argument("--data-dir", default="/tmp/fastpipe-ab-data")
    a = p.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    figures = {"old": [], "new": []}
    for r in range(a.rounds):
        for label in ("old", "new") if r % 2 == 0 else ("new", "old"):
            tree = a.old if label == "old" else a.new
            got = loader_figures(run(tree, LOADER, f"{a.out_dir}/loader_{label}_{r}.json", a.data_dir))
            got.update(images_figures(run(tree, IMAGES, f"{a.out_dir}/images_{label}_{r}.json", a.data_dir)))
            figures[label].append(got)
            print(f"round {r} {label}: " + ", ".join(f"{k} {v:.3g}" for k, v in got.items()), flush=True)
    print(f"\n| figure (median of {a.rounds} rounds) | old | new | new / old |\n|---|---:|---:|---:|")
    for k in figures["old"][0] if a.rounds else []:
        old = statistics.median(f[k] for f in figures["old"])
        new = statistics.median(f[k] for f in figures["new"])
        print(f"| {k} | {old:.4g} | {new:.4g} | {new / old:.3f} |")
    corpus = next(os.path.join(a.data_dir, d, "tree") for d in sorted(os.listdir(a.data_dir)) if d.startswith("images_"))
    pairs = {"old": [], "new": []}
    for r in range(a.pairs):
        for label in ("old", "new") if r % 2 == 0 else ("new", "old"):
            pairs[label].append(folder_rate(a.old if label == "old" else a.new, corpus))
    old, new = statistics.median(pairs["old"]), statistics.median(pairs["new"])
    print(f"| jpeg fastpipe_folder alone (img/s, median of {a.pairs} pairs) | {old:.4g} | {new:.4g} | {new / old:.3f} |")


if __name__ == "__main__":
    main()
