/*
 * wires.c - the API of a route to its wire table (wire.h), above the
 * three formats so that wire.c, which they call, knows none of them.
 */
#include "server/wire.h"

const struct ksv_wire *ksv_wire_of(int id)
{
	switch (id) {
	case KSV_WIRE_ANTHROPIC:
		return &ksv_wire_anthropic;
	case KSV_WIRE_RESPONSES:
		return &ksv_wire_responses;
	default:
		return &ksv_wire_openai;
	}
}
