# RDMA and CUDA tests (branch rdma).
# test_rdma_fake runs the transport on a software HCA; it needs verbs.h and
# is reduced to a skip when the verbs code is not built.
if(FERRY_HAVE_RDMA)
  target_compile_definitions(test_rdma_fake PRIVATE FERRY_HAVE_RDMA=1)
  target_include_directories(test_rdma_fake PRIVATE ${FERRY_IBVERBS_INCLUDE_DIR})
endif()
# libferry must not need libibverbs to load: it is dlopen'ed at run time.
find_program(FERRY_READELF readelf)
if(FERRY_READELF)
  add_test(NAME rdma_not_linked
           COMMAND sh -c "! ${FERRY_READELF} -d $<TARGET_FILE:ferry_shared> | grep -q libibverbs")
endif()
