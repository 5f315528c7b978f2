# CUDA tests (branch rdma): test_cuda is a skip unless built with
# -DFERRY_WITH_CUDA=ON; then it runs without a GPU too (see the file).
if(FERRY_HAVE_CUDA)
  target_compile_definitions(test_cuda PRIVATE FERRY_HAVE_CUDA=1)
  target_link_libraries(test_cuda PRIVATE CUDA::cudart)
endif()
