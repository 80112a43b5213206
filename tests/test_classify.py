"""Kernel classification and name normalisation, on kernel names found in the real traces."""

from __future__ import annotations

import pytest

from bayesprism.ingest.classify import (
    KERNEL_CLASS_RULES,
    classify_kernel,
    collective_class,
    normalize_kernel_name,
)
from bayesprism.ingest.kineto_json import load_trace
from bayesprism.schema import KERNEL_CLASSES

# Real names from /work/shared/data/kineto (one or more per family), with the class they must get.
REAL_NAMES = [
    # cuBLAS / CUTLASS / xmma GEMM and GEMV
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>"
     "(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)", "gemm"),
    ("volta_sgemm_64x64_nt", "gemm"),
    ("ampere_sgemm_128x128_tn", "gemm"),
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedBatched<float"
     " const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float> >"
     "(cublasGemmSmallNParams<cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)",
     "gemm"),
    ("void splitKreduce_kernel<float, float, float, float, true, false, false>(cublasSplitKParams"
     "<float>, float const*, float const*, float*, float const*, float const*, float const*)",
     "gemm"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 2, 2, false, false, "
     "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched"
     "<float const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParams<"
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float>, float>, float, float)", "gemm"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_"
     "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer", "gemm"),
    # cuDNN convolutions and their helper kernels -> gemm
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "gemm"),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused"
     "::WinogradDataParams<float, float>)", "gemm"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float "
     "const*, int, float const*, int, float*, kernel_grad_params, unsigned long long, int, float,"
     " int, int, int)", "gemm"),
    ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, "
     "int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int,"
     " int)", "gemm"),
    ("cask_cudnn_infer::computeBOffsetsKernel(cask_cudnn_infer::ComputeBOffsetsParams)", "gemm"),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>"
     "(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)", "gemm"),
    # element-wise / vectorized / copies
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array"
     "<char*, 3>)", "elementwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
     "TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#8}::operator()() const::"
     "{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, "
     "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::"
     "memory::StoreWithCast<1> >(int, ...)", "elementwise"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>"
     "(float*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned int, "
     "128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, "
     "unsigned int)", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor "
     "const&, long, long, double)::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, ...)",
     "elementwise"),
    # layer norm / batch norm
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, "
     "float,"
     " float const*, float const*, float const*, float*, float*, float*)", "norm"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long,"
     " float const*, float const*, float const*, float const*, float*, float*)", "norm"),
    ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args"
     "<float>)", "norm"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float, float, float, "
     "float, cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, "
     "float*, float const*, float*, float*, float const*, float const*, float)", "norm"),
    # optimizers (multi_tensor_apply: Adam and foreach steps)
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, "
     "float, float, float, float, adamMode_t, float, int, int>(int, int volatile*, "
     "TensorListMetadata<4>&, AdamFunctor<float>, float, float, float, float, float, float, "
     "adamMode_t, float, int, int)", "optimizer"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
     "BinaryOpListAlphaFunctor"
     "<float, 2, 2, 0>, std::plus<float>, float>(...)", "optimizer"),
    # memcpy / memset activities
    ("Memcpy HtoD (Pinned -> Device)", "memcpy"),
    ("Memcpy DtoD (Device -> Device)", "memcpy"),
    ("Memset (Device)", "memcpy"),
    # NCCL by collective type, both naming schemes
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "allreduce"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "allreduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     "sendrecv"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     "broadcast"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "allgather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
     "reducescatter"),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "sendrecv"),
    # fused attention (not in the shared traces; names as FlashAttention / xformers write them)
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4,"
     " false, false, cutlass::bfloat16_t> >(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::"
     "half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    # embedding, sorting, reductions, anonymous Triton kernels -> other
    ("void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<float,"
     " float, float, 1ul, 16>(...)", "other"),
    ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
     "other"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800"
     ", false, long, int, int, int>(int*, int*, int*, int const*, long*, long const*, int*, int "
     "const*, int, int, int)", "other"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float,"
     " float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, "
     "float>, unsigned int, float, 4>)", "other"),
    ("triton__0d1d2d3d", "other"),
]


@pytest.mark.parametrize(("name", "expected"), REAL_NAMES)
def test_real_kernel_names_get_their_family_class(name, expected):
    assert classify_kernel(name) == expected
    assert classify_kernel(normalize_kernel_name(name)) == expected


def test_rules_only_use_schema_classes():
    assert {cls for cls, _ in KERNEL_CLASS_RULES} <= set(KERNEL_CLASSES)


def test_collective_name_argument_maps_to_classes():
    assert collective_class("allreduce") == "allreduce"
    assert collective_class("_allgather_base") == "allgather"
    assert collective_class("reduce_scatter_tensor_coalesced") == "reducescatter"
    assert collective_class("all_to_allv") == "alltoall"
    assert collective_class("send") == "sendrecv"
    assert collective_class(None) is None
    assert collective_class("barrier") is None


def test_normalisation_strips_return_type_and_parameter_list_only():
    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
            "at::detail::Array<char*, 1>)")
    assert normalize_kernel_name(name) == (
        "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1> >")
    # Both NCCL parameter-list spellings give one kernel name.
    assert (normalize_kernel_name("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)")
            == normalize_kernel_name("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, "
                                     "unsigned long, ncclWork*)")
            == "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t")
    assert normalize_kernel_name("Memcpy HtoD (Pinned -> Device)") == (
        "Memcpy HtoD (Pinned -> Device)")
    assert normalize_kernel_name("volta_sgemm_64x64_nt") == "volta_sgemm_64x64_nt"


def test_every_kernel_name_in_the_shared_traces_is_classified_by_family(shared_data):
    """Families recognisable from the name alone never fall through to ``other``."""
    names: set[str] = set()
    for path in sorted((shared_data / "kineto").rglob("*.json.gz")):
        _, events = load_trace(path)
        names.update(e.name for e in events if e.cat in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert len(names) > 300
    families = [
        (("nccl", "allreduce"), "allreduce"), (("nccl", "sendrecv"), "sendrecv"),
        (("nccl", "broadcast"), "broadcast"), (("cutlass::kernel",), "gemm"),
        (("sgemm",), "gemm"), (("scudnn",), "gemm"), (("xmma",), "gemm"),
        (("layer_norm",), "norm"), (("bn_fw",), "norm"), (("bn_bw",), "norm"),
        (("multi_tensor_apply",), "optimizer"), (("memcpy",), "memcpy"), (("memset",), "memcpy"),
        (("vectorized_elementwise_kernel<4, at::native::cudafunctor",), "elementwise"),
        (("split_embedding",), "other"),
    ]
    checked = 0
    for name in names:
        lower = name.lower()
        for words, expected in families:
            if all(w in lower for w in words):
                assert classify_kernel(name) == expected, name
                checked += 1
                break
    assert checked > 150
