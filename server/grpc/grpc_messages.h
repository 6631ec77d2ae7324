/*
 * grpc_messages.h - the gRPC front end's protocol layer: protobuf messages
 * of server/proto/grpc_service.proto (C from protoc-c, in $(BUILD)/gen)
 * turned into server/kserve's transport-neutral kserve_request, and
 * kserve_row results into ModelInferResponse bytes. No gRPC here: the
 * transport (grpc_server.c) hands in bytes and gets bytes back, so this
 * layer is tested and fuzzed like kserve.c.
 *
 * ModelInfer takes one input, input_ids INT64 [B,T] (or [T], read as
 * [1,T]), as contents.int64_contents or as raw_input_contents[0] (B*T
 * little-endian int64); or text_input BYTES [B] (or [B,1]) as
 * contents.bytes_contents or raw_input_contents[0] (each element a 4-byte
 * little-endian length and its bytes), answered by default with
 * text_output BYTES [B] in the same raw form (the transport encodes the
 * prompts: kserve_encode_text). Request parameters (engine/gen_params.def,
 * with the ranges REST has), by InferParameter kind:
 *   max_new_tokens, top_k, seed: int64_param or uint64_param (INT, U64)
 *   temperature, top_p:          double_param (Triton) or int64_param (REAL)
 *   stop_token_ids:              string_param, ids separated by ','
 *                                (KServe's InferParameter has no list)
 *   stop:                        string_param, one stop string (text only)
 *   binary_data_output:          bool_param, accepted and ignored (gRPC
 *                                outputs are always raw_output_contents)
 *   triton_enable_empty_final_response: bool_param, accepted and ignored
 *                                (the last token's response is the final one)
 * Outputs: output_ids INT64 [B,N] (rows shorter than the longest padded
 * with -1) and, when asked for, logits FP32 [B,vocab] and text_output, in the order asked,
 * as raw_output_contents (what tritonclient reads). Every row is checked
 * with request_check (through kserve_row_request) before any is submitted.
 */
#ifndef FERRY_GRPC_MESSAGES_H
#define FERRY_GRPC_MESSAGES_H

#include <grpc/status.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../budget.h"
#include "../kserve.h"

/* Parses ModelInferRequest bytes: *model gets the model_name (malloc'd,
 * also on failure when the message decoded; NULL otherwise) so that the
 * caller can answer NOT_FOUND before INVALID_ARGUMENT. With a budget, the
 * decoded message's memory is taken from it while the parse runs (all
 * given back when it returns); a message the budget cannot hold is
 * FERRY_ERR_BUSY. */
ferry_status grpc_infer_parse(const uint8_t *buf, size_t len, const engine_limits *lim, req_budget *budget,
                              kserve_request *out, char **model);

/* ModelInferResponse bytes (malloc'd) for the rows of r. */
ferry_status grpc_infer_response(const kserve_request *r, const char *model, const kserve_row *rows, int vocab,
                                 uint8_t **out, size_t *out_len);

/* Parses a Model{Ready,Metadata,Config,Statistics}Request's name and
 * version (the four are {string name = 1; string version = 2}). */
ferry_status grpc_model_ref_parse(const uint8_t *buf, size_t len, char **name, char **version);

/* The packed bodies of the small answers. */
ferry_status grpc_bool_response(int which, int value, uint8_t **out, size_t *out_len); /* GRPC_MSG_* */
ferry_status grpc_server_metadata_response(uint8_t **out, size_t *out_len);
ferry_status grpc_model_metadata_response(const char *model, int vocab, uint8_t **out, size_t *out_len);
/* Triton's ModelConfigResponse and ModelStatisticsResponse (one model),
 * from the structs REST's /config and /stats are written from. */
ferry_status grpc_model_config_response(const kserve_config *c, uint8_t **out, size_t *out_len);
ferry_status grpc_model_stats_response(const char *model, const kserve_stats *k, uint8_t **out, size_t *out_len);

enum { GRPC_MSG_LIVE, GRPC_MSG_READY, GRPC_MSG_MODEL_READY };

/* ModelStreamInfer (Triton's decoupled stream): one ModelStreamInferResponse
 * per generated token, output_ids INT64 [1,1], with parameter
 * triton_final_response (true on the request's last; token NULL: an empty
 * final response), and the error response of one request (error_message,
 * with the request's id; the stream goes on). */
ferry_status grpc_stream_token_response(const char *model, const char *id, const int32_t *token, bool final,
                                        uint8_t **out, size_t *out_len);
/* A streamed text request's response: text_output BYTES [1] holding the
 * text that became final (a 4-byte length, then the bytes; final: the
 * request's last response, its text possibly empty). */
ferry_status grpc_stream_text_response(const char *model, const char *id, const char *text, size_t len, bool final,
                                       uint8_t **out, size_t *out_len);
ferry_status grpc_stream_error_response(const char *msg, const char *model, const char *id, uint8_t **out,
                                        size_t *out_len);
/* The id of ModelInferRequest bytes that failed to parse whole (malloc'd;
 * NULL when none or undecodable), for its error response. */
char *grpc_infer_peek_id(const uint8_t *buf, size_t len);

/* The gRPC code of an outcome (ferry_status maps one to one). */
grpc_status_code grpc_status_of(ferry_status st);

#endif
