"""Laplace over the LoRA weights of a GPT-2 classifier: laplace-torch 0.3 against fspace.Laplace,
and post-hoc FSP-Laplace on the same model — time and peak memory side by side.

The model and task are the LoRA test's (`crates/fspace-py/tests/lora_model.py`: transformers'
GPT-2 built from a config, peft LoRA adapters on the attention projections and the
classification head, a generated sequence-classification task with dict batches), at the size
given by the options. Each measurement runs in its own subprocess, which fine-tunes the same
seeded model, then times `fit(loader)` (laplace-torch's HuggingFace recipe:
`subset_of_weights="all"` over the `requires_grad` subset), `log_marginal_likelihood`, and the
probit predictive on a test batch, and reads the peak resident set (`VmHWM`) against the
resident set before the fit. The evidence of both libraries is printed beside the times.

    python scripts/compare/lora_laplace.py [--n 512] [--length 32] [--width 64] [--layers 4] [--out DIR]

Opt-in (not part of the test suite): needs torch, laplace-torch, transformers and peft beside
the `fspace` package.
"""

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = [("laplace-torch", "kron"), ("fspace", "kron"), ("laplace-torch", "diag"), ("fspace", "diag"),
         ("fspace-fsp", "fsp_laplace")]


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def child(args):
    import torch

    warnings.simplefilter("ignore")
    sys.path.insert(0, str(ROOT / "crates" / "fspace-py" / "tests"))
    from lora_model import Sequences, fine_tune, lora_gpt2

    model = lora_gpt2(vocab=args.vocab, length=args.length, width=args.width, layers=args.layers, heads=4,
                      rank=args.rank)
    loader = torch.utils.data.DataLoader(Sequences(args.n, args.length, args.vocab, seed=1), batch_size=32)
    fine_tune(model, loader, epochs=2)
    test = next(iter(torch.utils.data.DataLoader(Sequences(64, args.length, args.vocab, seed=2), batch_size=64)))
    lib, structure = args.case.split(":")
    before = status_kib("VmRSS")
    t0 = time.perf_counter()
    if lib == "fspace-fsp":
        import fspace

        K = fspace.kernels
        prior = fspace.GPPrior(K.Independent(K.RBF(1.0, float(4 * args.length) ** 0.5 * args.vocab / 4), 2))
        la = fspace.FSPLaplace(model, "classification", prior, train=False, design="Dataset", n_laplace_context=64)
        la.fit(loader)
        fit_s = time.perf_counter() - t0
        evidence, evidence_s = None, None
    else:
        if lib == "fspace":
            import fspace as mod
        else:
            import laplace as mod
        la = mod.Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure)
        la.fit(loader)
        fit_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        evidence = float(la.log_marginal_likelihood(torch.tensor(1.0, dtype=torch.float64)))
        evidence_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    probs = la(test)
    predict_s = time.perf_counter() - t2
    peak = status_kib("VmHWM")
    print(json.dumps({"case": args.case, "n": args.n, "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                      "fit_s": fit_s, "evidence_s": evidence_s, "predict_s": predict_s, "evidence": evidence,
                      "probs_head": [float(v) for v in probs[:2, 0]],
                      "rss_before_mib": before / 1024, "peak_growth_mib": (peak - before) / 1024}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows = []
    for lib, structure in CASES:
        cmd = [sys.executable, __file__, "--child", "--case", f"{lib}:{structure}"]
        for key in ("n", "vocab", "length", "width", "layers", "rank"):
            cmd += [f"--{key}", str(getattr(args, key))]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "lora_laplace.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
