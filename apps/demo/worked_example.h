#pragma once
// The worked example of the seed document (self-attention-explained.zh.txt), as data: its inputs
// and the values it prints, rounded as it rounds them. Copied here so the demo needs no other file.
#include <array>

namespace demo {

constexpr int kTokens = 11;
constexpr int kModel = 4;  // d_model: embedding width
constexpr int kDim = 2;    // d_k: width of each query, key and value

// The sentence 这个动物并没有过马路，因为它太累了 ("the animal didn't cross the street because it was too tired").
constexpr std::array<const char*, kTokens> kTokenText{"这个", "动物", "并", "没有", "过", "马路", "因为", "它", "太", "累", "了"};

// X: one embedding row per token.
constexpr float kX[kTokens][kModel] = {
    {0.12f, -0.45f, 0.31f, 0.08f},  {0.55f, 0.20f, -0.11f, 0.44f}, {-0.09f, 0.33f, 0.15f, -0.22f},
    {0.41f, -0.18f, -0.36f, 0.19f}, {0.07f, 0.29f, -0.05f, 0.33f}, {0.62f, -0.10f, 0.24f, -0.31f},
    {-0.28f, 0.44f, 0.09f, 0.17f},  {0.19f, -0.37f, 0.28f, 0.06f}, {0.33f, 0.11f, -0.19f, -0.08f},
    {-0.15f, 0.52f, 0.06f, -0.29f}, {0.03f, -0.05f, 0.02f, 0.01f}};

// Projections, d_model x d_k: Q = X WQ, K = X WK, V = X WV.
constexpr float kWQ[kModel][kDim] = {{1, 0}, {0, 1}, {1, 1}, {0, -1}};
constexpr float kWK[kModel][kDim] = {{0.5f, 0}, {0, 0.5f}, {0.5f, 0.5f}, {0, -0.5f}};
constexpr float kWV[kModel][kDim] = {{0.1f, 0.2f}, {0.2f, 0.1f}, {-0.1f, 0.3f}, {0.3f, -0.2f}};

// The document's example: a 3-token sequence 动物 马路 它, and the query 它 (its last token).
constexpr std::array<int, 3> kExampleTokens{1, 5, 7};

// What the document prints for it.
constexpr double kPrintedQ[3][2] = {{0.44, -0.35}, {0.86, 0.45}, {0.47, -0.15}};
constexpr double kPrintedK[3][2] = {{0.22, -0.175}, {0.43, 0.225}, {0.235, -0.075}};
constexpr double kPrintedV[3][2] = {{0.238, 0.009}, {-0.075, 0.248}, {-0.065, 0.073}};
constexpr double kPrintedScores[3] = {0.12965, 0.16835, 0.1217};
constexpr double kPrintedScaled[3] = {0.092, 0.119, 0.086};
constexpr double kPrintedDenominator = 3.3125069954097492;  // sum of exp of the rounded scaled scores
constexpr double kPrintedWeights[3] = {0.331, 0.34, 0.329};
constexpr double kPrintedOutput[2] = {0.031, 0.111};  // exact arithmetic gives 0.0319: the document rounds the weights first

}  // namespace demo
