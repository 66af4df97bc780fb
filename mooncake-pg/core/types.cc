#include "mooncake-pg/core/types.h"

namespace mooncake::pg {

size_t dataTypeSize(DataType t) {
    switch (t) {
        case DataType::kFloat32:
            return 4;
        case DataType::kFloat64:
            return 8;
        case DataType::kFloat16:
            return 2;
        case DataType::kBFloat16:
            return 2;
        case DataType::kInt8:
            return 1;
        case DataType::kUInt8:
            return 1;
        case DataType::kInt16:
            return 2;
        case DataType::kInt32:
            return 4;
        case DataType::kInt64:
            return 8;
        case DataType::kBool:
            return 1;
    }
    return 0;
}

const char* dataTypeName(DataType t) {
    switch (t) {
        case DataType::kFloat32:
            return "float32";
        case DataType::kFloat64:
            return "float64";
        case DataType::kFloat16:
            return "float16";
        case DataType::kBFloat16:
            return "bfloat16";
        case DataType::kInt8:
            return "int8";
        case DataType::kUInt8:
            return "uint8";
        case DataType::kInt16:
            return "int16";
        case DataType::kInt32:
            return "int32";
        case DataType::kInt64:
            return "int64";
        case DataType::kBool:
            return "bool";
    }
    return "unknown_dtype";
}

const char* reduceOpName(ReduceOp op) {
    switch (op) {
        case ReduceOp::kSum:
            return "sum";
        case ReduceOp::kAvg:
            return "avg";
        case ReduceOp::kProduct:
            return "product";
        case ReduceOp::kMin:
            return "min";
        case ReduceOp::kMax:
            return "max";
        case ReduceOp::kBand:
            return "band";
        case ReduceOp::kBor:
            return "bor";
        case ReduceOp::kBxor:
            return "bxor";
    }
    return "unknown_op";
}

bool isFloatingPoint(DataType t) {
    return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
           t == DataType::kBFloat16;
}

bool reduceOpSupported(ReduceOp op, DataType t, std::string* why) {
    auto fail = [&](const char* reason) {
        if (why != nullptr) {
            *why = std::string("reduce op ") + reduceOpName(op) + " is not supported for dtype " +
                   dataTypeName(t) + ": " + reason;
        }
        return false;
    };
    // Values outside the enums arrive from casts at the torch boundary.
    if (dataTypeSize(t) == 0)
        return fail("unknown dtype");
    switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kProduct:
        case ReduceOp::kMin:
        case ReduceOp::kMax:
            return true;
        case ReduceOp::kAvg:
            if (isFloatingPoint(t))
                return true;
            return fail("avg needs a floating-point dtype");
        case ReduceOp::kBand:
        case ReduceOp::kBor:
        case ReduceOp::kBxor:
            if (!isFloatingPoint(t))
                return true;
            return fail("bitwise ops need an integer or bool dtype");
    }
    return fail("unknown reduce op");
}

}  // namespace mooncake::pg
