# Finds CUDA headers, NCCL headers, NVTX3 and GoogleTest. Each missing dependency is a
# configure error that says how to get it.
find_package(Threads REQUIRED)

# CUDA: CUDA_HOME, else the directory of nvcc on PATH, else /usr/local/cuda.
if(DEFINED ENV{CUDA_HOME})
  set(_cuda_home $ENV{CUDA_HOME})
else()
  find_program(_nvcc nvcc PATHS /usr/local/cuda/bin)
  if(_nvcc)
    get_filename_component(_cuda_home ${_nvcc} DIRECTORY)
    get_filename_component(_cuda_home ${_cuda_home} DIRECTORY)
  endif()
endif()
find_path(ZEROCTA_CUDA_INCLUDE_DIR cuda.h HINTS ${_cuda_home}/include)
if(NOT ZEROCTA_CUDA_INCLUDE_DIR)
  message(FATAL_ERROR "zerocta: CUDA headers (cuda.h) not found. Install the CUDA Toolkit and "
                      "set CUDA_HOME=/path/to/cuda or put nvcc on PATH.")
endif()
get_filename_component(ZEROCTA_CUDA_HOME ${ZEROCTA_CUDA_INCLUDE_DIR} DIRECTORY)
message(STATUS "zerocta: CUDA headers in ${ZEROCTA_CUDA_INCLUDE_DIR}")

# NCCL headers: NCCL_HOME, else the CUDA include dir.
find_path(ZEROCTA_NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_HOME}/include ${ZEROCTA_CUDA_INCLUDE_DIR}
          NO_DEFAULT_PATH)
find_path(ZEROCTA_NCCL_INCLUDE_DIR nccl.h)
if(NOT ZEROCTA_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "zerocta: nccl.h not found. Install NCCL's headers (apt-get install "
                      "libnccl-dev, or the NCCL tarball) and set NCCL_HOME=/path/to/nccl.")
endif()
file(STRINGS ${ZEROCTA_NCCL_INCLUDE_DIR}/nccl.h _nccl_code REGEX "#define NCCL_VERSION_CODE")
string(REGEX MATCH "[0-9]+" ZEROCTA_NCCL_HEADER_CODE "${_nccl_code}")
if(ZEROCTA_NCCL_HEADER_CODE LESS 22800)
  message(FATAL_ERROR "zerocta: nccl.h in ${ZEROCTA_NCCL_INCLUDE_DIR} is ${ZEROCTA_NCCL_HEADER_CODE}; "
                      "2.28 or newer headers are required (NCCL_HOME=...).")
endif()
message(STATUS "zerocta: NCCL headers ${ZEROCTA_NCCL_HEADER_CODE} in ${ZEROCTA_NCCL_INCLUDE_DIR}")

# NVTX3 is header-only and ships with CUDA.
find_path(ZEROCTA_NVTX_INCLUDE_DIR nvtx3/nvToolsExt.h HINTS ${ZEROCTA_CUDA_INCLUDE_DIR})
if(NOT ZEROCTA_NVTX_INCLUDE_DIR)
  message(FATAL_ERROR "zerocta: NVTX3 headers (nvtx3/nvToolsExt.h) not found; they ship with "
                      "the CUDA Toolkit (CUDA_HOME=...).")
endif()

# The real NCCL and CUDA runtime libraries are needed only by tools and GPU tests.
find_library(ZEROCTA_NCCL_LIBRARY NAMES nccl HINTS $ENV{NCCL_HOME}/lib ${ZEROCTA_CUDA_HOME}/lib64)
find_library(ZEROCTA_CUDART_LIBRARY NAMES cudart HINTS ${ZEROCTA_CUDA_HOME}/lib64)
find_library(ZEROCTA_CUBLAS_LIBRARY NAMES cublas HINTS ${ZEROCTA_CUDA_HOME}/lib64)

if(ZEROCTA_BUILD_TESTS)
  find_package(GTest)
  if(NOT GTest_FOUND)
    message(FATAL_ERROR "zerocta: GoogleTest not found. apt-get install -y libgtest-dev "
                        "(or -DZEROCTA_BUILD_TESTS=OFF).")
  endif()
endif()
