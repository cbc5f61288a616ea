// torch::Tensor wrappers of bench/profile_capture.py (main.cpp of the load_inline module).
#include <torch/extension.h>

void launch_naive_matmul(const float* A, const float* B, float* C, int N);
void launch_tiled_matmul(const float* A, const float* B, float* C, int N);
void launch_wmma_matmul(const void* A, const void* B, float* C, int N);
void launch_naive_softmax(const float* x, float* y, int rows, int cols);
void launch_warp_softmax(const float* x, float* y, int rows, int cols);
void launch_copy_vec4(const float* x, float* y, int n);
void launch_copy_scalar(const float* x, float* y, int n);
void launch_spill(const float* x, float* y, int n);
void launch_bank_conflict(const float* x, float* y, int n);
void launch_strided_copy(const float* x, float* y, int n, int stride);
void launch_fp64_poly(const double* x, double* y, int n);
void launch_tiny(float* x);

torch::Tensor naive_matmul(torch::Tensor A, torch::Tensor B) {
  auto C = torch::empty_like(A);
  launch_naive_matmul(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), A.size(0));
  return C;
}
torch::Tensor tiled_matmul(torch::Tensor A, torch::Tensor B) {
  auto C = torch::empty_like(A);
  launch_tiled_matmul(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), A.size(0));
  return C;
}
torch::Tensor wmma_matmul(torch::Tensor A, torch::Tensor B) {
  int N = A.size(0);
  auto C = torch::empty({N, N}, A.options().dtype(torch::kFloat));
  launch_wmma_matmul(A.data_ptr(), B.data_ptr(), C.data_ptr<float>(), N);
  return C;
}
torch::Tensor naive_softmax(torch::Tensor x) {
  auto y = torch::empty_like(x);
  launch_naive_softmax(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1));
  return y;
}
torch::Tensor warp_softmax(torch::Tensor x) {
  auto y = torch::empty_like(x);
  launch_warp_softmax(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1));
  return y;
}
torch::Tensor copy_vec4(torch::Tensor x) {
  auto y = torch::empty_like(x);
  launch_copy_vec4(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
torch::Tensor copy_scalar(torch::Tensor x) {
  auto y = torch::empty_like(x);
  launch_copy_scalar(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
torch::Tensor spill(torch::Tensor x) {
  auto y = torch::empty_like(x);
  launch_spill(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
torch::Tensor bank_conflict(torch::Tensor x) {
  auto y = torch::empty_like(x);
  launch_bank_conflict(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
torch::Tensor strided_copy(torch::Tensor x, int64_t stride) {
  auto y = torch::empty_like(x);
  launch_strided_copy(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), (int)stride);
  return y;
}
torch::Tensor fp64_poly(torch::Tensor x) {
  auto y = torch::empty_like(x);
  launch_fp64_poly(x.data_ptr<double>(), y.data_ptr<double>(), x.numel());
  return y;
}
torch::Tensor tiny(torch::Tensor x) {
  launch_tiny(x.data_ptr<float>());
  return x;
}
