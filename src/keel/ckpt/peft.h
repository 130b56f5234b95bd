// LoRA adapters in Hugging Face PEFT's layout, so that a keel LoRA run loads with
// peft.PeftModel.from_pretrained(base, DIR) on the base model keel started from:
//   DIR/adapter_config.json      peft_type LORA, r, lora_alpha, target_modules (HF module names),
//                                fan_in_fan_out (GPT-2's Conv1D)
//   DIR/adapter_model.safetensors  base_model.model.<HF module>.lora_A.weight (r, in) and
//                                lora_B.weight (out, r)
// keel's fused products map onto HF's modules: a Llama's qkv adapter becomes q_proj's, k_proj's
// and v_proj's (the same A for the three, B's rows split), gate_up becomes gate_proj's and
// up_proj's; each delta B·A·lora_alpha/r is then exactly keel's.
#pragma once

#include <string>
#include <vector>

#include "keel/model/config.h"

namespace keel::ckpt {

// `adapters`: the adapters' values packed as ParamLayout::Whole(cfg)'s gradients are
// (ParamInfo::grad_offset; cfg.lora_rank > 0), as ReadCheckpointAdapters gives them. Writes both
// files (each atomically) into `dir`, created if needed.
void WritePeftAdapter(const std::string& dir, const model::ModelConfig& cfg, const float* adapters);

// The reverse: PEFT LoRA adapters from `dir` (keel's or any trained with PEFT on this base)
// merged into `weights`, ParamLayout::Whole(cfg)'s values of a model without adapters: each
// module's W += B·A·lora_alpha/r (use_rslora: /√r). Throws keel::Error (bad input) naming the file
// and what is wrong: not LoRA, DoRA, a tensor for no module of this model, a shape that differs.
void MergePeftAdapter(const std::string& dir, const model::ModelConfig& cfg,
                      std::vector<float>* weights);

}  // namespace keel::ckpt
