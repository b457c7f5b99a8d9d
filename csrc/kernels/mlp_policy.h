// MlpPolicy: the policy half of an MLP actor-critic (zrl.models.ActorCritic with
// model.network mlp, no LSTM core), evaluated without a framework.
//
// The agent server answers most requests one or a few at a time; for a 64x64
// MLP, torch's per-call overhead (dispatch, tensor wrappers, inference mode) is
// many times the arithmetic. This is the same function over preallocated
// buffers: observations [B, obs_dim] -> optional normalisation ->
// (Linear + activation) per torso layer -> the head's Linear -> parameters
// [B, out_dim] (a categorical head's logits, or a Gaussian head's means).
//
// Weights are float32 in torch's layout (Linear.weight [out, in], row-major);
// sums are float32, so results match torch to rounding, not bit for bit.
// Not thread-safe: one caller at a time (its scratch rows are reused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zrl {

enum class Activation : int { kTanh = 0, kRelu = 1 };

struct Dense {
  std::size_t in = 0, out = 0;
  std::vector<float> weight;  // [out, in], as torch.nn.Linear.weight
  std::vector<float> bias;    // [out]
};

// RunningMeanStd's forward (zrl/models/normalizer.py): clamp((x - mean) / sqrt(var + eps), -clip, clip).
// An empty mean means no normalisation.
struct ObsNormalizer {
  std::vector<float> mean, var;  // [obs_dim]
  float clip = 10.0f;
  float eps = 1e-8f;
};

class MlpPolicy {
 public:
  // Throws std::invalid_argument when the shapes do not chain (torso[0].in == obs_dim,
  // each layer's in == the previous out, head.in == the last torso out or obs_dim
  // without torso layers, vector sizes == in * out and out, normaliser sizes == obs_dim).
  MlpPolicy(std::size_t obs_dim, std::vector<Dense> torso, Activation activation, Dense head,
            ObsNormalizer norm = {});

  std::size_t obs_dim() const { return obs_dim_; }
  std::size_t out_dim() const { return head_.out; }

  // out[b, :] = head(torso(norm(obs[b, :]))) for b < batch; obs and out row-major.
  void forward(const float* obs, std::size_t batch, float* out);

 private:
  std::size_t obs_dim_;
  std::vector<Dense> torso_;
  Activation activation_;
  Dense head_;
  ObsNormalizer norm_;
  std::vector<std::vector<float>> torso_t_;  // each layer's weight transposed, [in, out]
  std::vector<float> head_t_;
  std::vector<float> a_, b_;  // scratch rows, grown to the largest batch seen
};

// A Gaussian head's draw (zrl.models.heads.GaussianHead): for b rows of a dims,
//   actions[i, j] = mean[i, j] + exp(log_std[j]) * normals[i, j]
//   logp[i]       = sum_j (-0.5 z^2 - log_std[j] - 0.5 log(2 pi)), z = (actions - mean) / exp(log_std)
// computed in float32 as torch computes log_prob from the action (so the recorded
// behaviour log-probability is the learner's to rounding). Returns the index of the
// first row whose action or logp is not finite, or b when all are (rows from the bad
// one on may be written).
std::size_t sample_gaussian(const float* mean, std::size_t b, std::size_t a, const float* log_std,
                            const double* normals, float* actions, float* logp);

}  // namespace zrl
