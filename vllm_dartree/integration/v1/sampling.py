"""V1: the sampling parameters a dartree engine applies itself (``integration/sampling.py``).

vLLM's V1 runner builds only the min_tokens processor for a speculative engine; a dartree
engine gets vLLM's built-in ones (:class:`BuiltinLogitsProcessors`: the bonus rows and steps
without drafts then apply logit bias and min p). Tree rows get allowed token ids, logit
bias, min_tokens (by the row's depth), penalties (each row counting its tree path) and min p
from :func:`tree_rows_as_target_only` before the tree verifier chooses, and the sampled
tokens' logprobs come from their nodes' rows (:func:`tree_logprobs`); the draft rows of
chain-verified requests get logit bias and min p inside vLLM's rejection sampler
(:class:`ChainRowsLogitBiasAndMinP`), which applies the rest."""

from __future__ import annotations

import functools

import numpy as np
import torch

from vllm_dartree.config import is_dartree_engine
from vllm_dartree.integration.patching import Runner, VllmPatch
from vllm_dartree.integration.touchpoints import V1_RELEASES
from vllm_dartree.step.verify_plan import (
    AcceptedPaths,
    VerifyPlan,
    accepted_row_order,
    path_tokens,
)
from vllm_dartree.tree import GREEDY_TEMPERATURE


class BuiltinLogitsProcessors(VllmPatch):
    """V1 runner's ``build_logitsprocs`` (a module global of the runner module): a dartree
    engine's input batch gets vLLM's built-in processors (min p, logit bias, min tokens),
    as an engine without speculation has them; vLLM's own choice for any other engine,
    pooling models and custom processors (which vLLM refuses with speculation)."""

    target = "vllm.v1.worker.gpu_model_runner"
    attribute = "build_logitsprocs"
    releases = V1_RELEASES
    runner = Runner.V1

    @classmethod
    def replacement(cls, original):
        from vllm.v1.sample.logits_processor import (
            BUILTIN_LOGITS_PROCESSORS,
            LogitsProcessors,
        )

        @functools.wraps(original)
        def build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model,
                              custom_logitsprocs=()):
            if (is_pooling_model or custom_logitsprocs
                    or not is_dartree_engine(vllm_config)):
                return original(vllm_config, device, is_pin_memory, is_pooling_model,
                                custom_logitsprocs)
            return LogitsProcessors(ctor(vllm_config, device, is_pin_memory)
                                    for ctor in BUILTIN_LOGITS_PROCESSORS)

        return build_logitsprocs


def row_requests(rows_per_request: list[int]) -> np.ndarray:
    """The batch index of each row, requests' rows one after another (vLLM's layout)."""
    return np.repeat(np.arange(len(rows_per_request)), rows_per_request)


def add_logit_bias(logits: torch.Tensor, biases: dict[int, dict[int, float]],
                   rows_per_request: list[int]) -> None:
    """Add each request's bias ({batch index: {token: bias}}, vLLM's
    ``LogitBiasLogitsProcessor.biases``) to every one of its rows, in place."""
    starts = np.cumsum([0, *rows_per_request])
    rows, tokens, values = [], [], []
    for req, bias in biases.items():
        n = rows_per_request[req] if req < len(rows_per_request) else 0
        if n == 0 or not bias:
            continue
        rows.append(np.repeat(np.arange(starts[req], starts[req] + n), len(bias)))
        tokens.append(np.tile(np.fromiter(bias.keys(), np.int64), n))
        values.append(np.tile(np.fromiter(bias.values(), np.float32), n))
    if rows:
        index = (torch.from_numpy(np.concatenate(rows)).to(logits.device),
                 torch.from_numpy(np.concatenate(tokens)).to(logits.device))
        logits[index] += torch.from_numpy(np.concatenate(values)).to(logits.device,
                                                                     logits.dtype)


def mask_below_min_p(logits: torch.Tensor, min_p: torch.Tensor,
                     temperature: torch.Tensor) -> None:
    """Set to -inf, in place, each row's tokens whose probability at the row's temperature
    is below ``min_p`` times the row's largest (vLLM's ``MinPLogitsProcessor`` on the
    tempered logits, the same arithmetic); ``min_p``/``temperature`` are per row; a greedy
    row's temperature (below ``GREEDY_TEMPERATURE``) counts as 1, as vLLM's
    ``apply_temperature`` has it."""
    temperature = torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature)
    probs = torch.softmax(logits / temperature.unsqueeze(1), dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True).mul_(min_p.unsqueeze(1))
    logits.masked_fill_(probs < threshold, float("-inf"))


def biases_and_min_p(sampling_metadata) -> tuple[dict[int, dict[int, float]] | None,
                                                  torch.Tensor | None]:
    """The batch's logit biases ({batch index: {token: bias}}) and min p per batch index
    (host), each None where no request of the batch has one (or all are greedy: min p
    never changes an argmax)."""
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
    )

    processors = sampling_metadata.logitsprocs
    bias = next((p for p in processors.non_argmax_invariant
                 if isinstance(p, LogitBiasLogitsProcessor)), None)
    min_p = next((p for p in processors.argmax_invariant
                  if isinstance(p, MinPLogitsProcessor)), None)
    biases = bias.biases if bias is not None and bias.biases else None
    if min_p is None or not min_p.min_p_count or sampling_metadata.temperature is None:
        return biases, None
    return biases, torch.from_numpy(min_p.min_p_cpu)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor, sampling_metadata,
                request: torch.Tensor) -> None:
    """:func:`mask_below_min_p` of rows whose batch index is ``request`` [rows] (on the
    logits' device; ``min_p`` per batch index, on the host)."""
    mask_below_min_p(logits, min_p.to(logits.device)[request],
                     sampling_metadata.temperature[request])


def add_penalties_on_paths(logits: torch.Tensor, sampling_metadata, request: torch.Tensor,
                           paths: torch.Tensor) -> None:
    """Presence, frequency and repetition penalties on every row, in place: row i counts its
    request's output so far (batch index ``request[i]``, on the logits' device; vLLM's
    ``output_token_ids``) plus
    ``paths[i]`` (its tree path, padded with the vocabulary size), through vLLM's
    ``apply_penalties``: what V1's rejection sampler does for a chain row with the chain's
    prefix."""
    from vllm.model_executor.layers.utils import apply_penalties

    vocab = logits.shape[1]
    outputs = sampling_metadata.output_token_ids
    table = np.full((len(outputs), max(map(len, outputs), default=0)), vocab, np.int64)
    for i, tokens in enumerate(outputs):
        table[i, : len(tokens)] = tokens
    table[table == -1] = vocab  # async scheduling's placeholders of rows without penalties
    output_rows = torch.cat([torch.from_numpy(table).to(logits.device)[request], paths], dim=1)
    apply_penalties(logits, sampling_metadata.prompt_token_ids[request], output_rows,
                    sampling_metadata.presence_penalties[request],
                    sampling_metadata.frequency_penalties[request],
                    sampling_metadata.repetition_penalties[request])


def short_of_min_tokens(sampling_metadata) -> dict[int, tuple] | None:
    """vLLM's ``MinTokensLogitsProcessor.min_toks`` of the batch ({batch index: (min_tokens,
    output so far, stop token ids, has a grammar)}, the requests still short of their
    min_tokens), None when there are none."""
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

    processor = next((p for p in sampling_metadata.logitsprocs.non_argmax_invariant
                      if isinstance(p, MinTokensLogitsProcessor)), None)
    return None if processor is None or not processor.min_toks else processor.min_toks


def mask_stop_before_min_tokens(logits: torch.Tensor, short: dict[int, tuple],
                                rows_per_request: list[int], depth: torch.Tensor) -> None:
    """Set each stop token of a request short of its min_tokens (``short``:
    :func:`short_of_min_tokens`) to -inf, in place, at the rows where it is still short: a
    row at tree depth ``depth[i]`` follows the request's output so far plus ``depth[i]``
    drafted tokens (vLLM's ``MinTokensLogitsProcessor`` at that row's length). Requests
    with a grammar verify as chains, so its restore rule for them does not arise here."""
    starts = np.cumsum([0, *rows_per_request])
    rows, tokens, short_by = [], [], []
    for req, (min_tokens, outputs, stops, _) in short.items():
        n = rows_per_request[req] if req < len(rows_per_request) else 0
        if n == 0 or not stops:
            continue
        rows.append(np.repeat(np.arange(starts[req], starts[req] + n), len(stops)))
        tokens.append(np.tile(np.fromiter(stops, np.int64), n))
        short_by.append(np.full(n * len(stops), min_tokens - len(outputs)))
    if not rows:
        return
    row, token, remaining = (torch.from_numpy(np.concatenate(a)).to(logits.device)
                             for a in (rows, tokens, short_by))
    index = (row, token)
    logits[index] = torch.where(depth[row] < remaining, float("-inf"), logits[index])


def tree_rows_as_target_only(logits: torch.Tensor, sampling_metadata, plan: VerifyPlan
                             ) -> torch.Tensor:
    """The step's logits rows (laid out as ``plan`` says: each request's rows one after
    another) with each request's allowed token ids, logit bias, min_tokens, penalties and min p
    applied in target-only's order (mask, bias and min_tokens by the row's depth, penalties
    over the output so far plus the row's tree path, then min p at the row's temperature;
    the tree verifier then applies temperature, top-k and top-p), in float32 as vLLM's
    sampler works; ``logits`` itself unchanged. The other parameters' requests verify as
    chains (``verify_plan``)."""
    allowed = sampling_metadata.allowed_token_ids_mask
    biases, min_p = biases_and_min_p(sampling_metadata)
    penalties = not sampling_metadata.no_penalties
    short = short_of_min_tokens(sampling_metadata)
    if allowed is None and biases is None and min_p is None and not penalties and not short:
        return logits
    rows_per_request = np.diff([*plan.logit_starts, plan.num_logit_rows]).tolist()
    request = plan.request_of_logit_row
    logits = logits.to(torch.float32, copy=True)
    paths = path_tokens(plan, logits.shape[1]) if penalties or short else None
    if allowed is not None:
        logits.masked_fill_(allowed[request], float("-inf"))
    if biases is not None:
        add_logit_bias(logits, biases, rows_per_request)
    if short:
        mask_stop_before_min_tokens(logits, short, rows_per_request,
                                    (paths < logits.shape[1]).sum(dim=1))
    if penalties:
        add_penalties_on_paths(logits, sampling_metadata, request, paths)
    if min_p is not None:
        apply_min_p(logits, min_p, sampling_metadata, request)
    return logits


def tree_logprobs(sampler, logits: torch.Tensor, num_logprobs: int | None,
                  sampled: torch.Tensor, paths: AcceptedPaths):
    """vLLM's logprobs tensors of a tree step's sampled tokens ([R, columns], -1 padded),
    each from the raw logits row of the node it was drawn at, laid out as V1's rejection
    sampler lays them out (request r's j-th token at logits row ``first_logit_row[r] + j``,
    clamped; placeholders as token 0, dropped by vLLM's ``parse_output``); None when no
    request asks for logprobs. Raw modes only: a processed mode's requests verify as
    chains (``verify_plan.verifies_as_chain_on_v1``)."""
    if num_logprobs is None:
        return None
    plan = paths.plan
    order = accepted_row_order(paths, plan.num_logit_rows, plan.node_logit_rows[:, 0])
    columns = torch.arange(sampled.shape[1], device=sampled.device)
    rows = (plan.first_logit_row.unsqueeze(1) + columns).flatten()
    path_logits = logits[order[rows.clamp(max=plan.num_logit_rows - 1)]].to(torch.float32)
    logprobs = (path_logits if sampler.logprobs_mode == "raw_logits"
                else sampler.compute_logprobs(path_logits))
    return sampler.gather_logprobs(logprobs, num_logprobs,
                                   sampled.flatten().clamp(min=0).to(torch.int64))


def rows_of_requests(tensors, others, requests: list[int], columns: int):
    """``tensors`` (vLLM's ``LogprobsTensors``, ``columns`` rows per request) with the rows of
    batch indices ``requests`` taken from ``others``: the chain requests' logprobs from
    vLLM's rejection sampler, the tree requests' from :func:`tree_logprobs`."""
    if tensors is None or others is None:
        return tensors if others is None else others
    rows = (torch.tensor(requests, device=tensors.logprobs.device).unsqueeze(1) * columns
            + torch.arange(columns, device=tensors.logprobs.device)).flatten()
    fields = []
    for mine, theirs in zip(tensors[:3], others[:3]):
        merged = mine.clone()
        merged[rows] = theirs[rows].to(mine.dtype)
        fields.append(merged)
    return tensors._replace(logprob_token_ids=fields[0], logprobs=fields[1],
                            selected_token_ranks=fields[2])


class ChainRowsLogitBiasAndMinP(VllmPatch):
    """V1 ``RejectionSampler.apply_logits_processors``: the draft rows get their request's
    logit bias (before vLLM's penalties) and min p (after them), as target-only's sampler
    applies them. A speculative engine other than dartree has neither (vLLM refuses them)."""

    target = "vllm.v1.sample.rejection_sampler:RejectionSampler"
    attribute = "apply_logits_processors"
    releases = V1_RELEASES
    runner = Runner.V1

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def apply_logits_processors(self, logits, sampling_metadata, metadata):
            biases, min_p = biases_and_min_p(sampling_metadata)
            if biases is not None:
                add_logit_bias(logits, biases, metadata.num_draft_tokens)
            logits = original(self, logits, sampling_metadata, metadata)
            if min_p is not None:
                request = torch.from_numpy(row_requests(metadata.num_draft_tokens))
                apply_min_p(logits, min_p, sampling_metadata, request.to(logits.device))
            return logits

        return apply_logits_processors

