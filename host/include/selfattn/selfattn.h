#pragma once
// The whole public API.
#include "selfattn/attention.h"
#include "selfattn/backward.h"
#include "selfattn/buffer.h"
#include "selfattn/context.h"
#include "selfattn/error.h"
#include "selfattn/kv_cache.h"
#include "selfattn/mask_options.h"
#include "selfattn/reference.h"
#include "selfattn/tensor.h"
#include "selfattn/types.h"
#include "selfattn/version.h"
