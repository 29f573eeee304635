/*
 * xcopy_range: an initiator that asks a LUN's copy manager for EXTENDED COPY
 * (LID1) between any two block ranges, the way ESXi clones a virtual disk:
 * copy target descriptors are identification descriptors (0xE4) naming each
 * LUN by its NAA designator, segments are block-to-block (0x02).
 *
 *   xcopy_range DST_URL DST_LBA SRC_URL SRC_LBA BLOCKS [COMMAND_BLOCKS]
 *
 * LBAs and counts are in the LUNs' logical blocks. The command goes to the
 * destination LUN; SRC_URL may name the same LUN (a copy inside one
 * datastore volume). COMMAND_BLOCKS (default 32768: 16 MiB of 512-byte
 * blocks) bounds one command; its segments stay whole 4 KiB blocks. Prints
 * the elapsed time and the commands sent; exits 1 on any failure.
 *
 * Build: cc -O2 -o xcopy_range xcopy_range.c -liscsi (Debian libiscsi-dev).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

/* Blocks one segment descriptor carries: its count field is 16 bits; kept a
 * multiple of 8 so 512-byte blocks never split a 4 KiB block. */
#define SEGMENT_BLOCKS_MAX 65528u
#define SEGMENTS_MAX 16
#define HEADER_BYTES 16
#define TARGET_BYTES 32
#define SEGMENT_BYTES 28

struct lun {
	struct iscsi_context *iscsi;
	struct iscsi_url *url;
	unsigned char naa[16];
	int naa_len;
	uint32_t block_bytes;
};

static int lun_open(const char *text, const char *initiator, struct lun *l)
{
	l->iscsi = iscsi_create_context(initiator);
	if (!l->iscsi) {
		fprintf(stderr, "no iSCSI context\n");
		return -1;
	}
	l->url = iscsi_parse_full_url(l->iscsi, text);
	if (!l->url) {
		fprintf(stderr, "%s: %s\n", text, iscsi_get_error(l->iscsi));
		return -1;
	}
	iscsi_set_targetname(l->iscsi, l->url->target);
	iscsi_set_session_type(l->iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(l->iscsi, ISCSI_HEADER_DIGEST_NONE_CRC32C);
	if (iscsi_full_connect_sync(l->iscsi, l->url->portal, l->url->lun)) {
		fprintf(stderr, "login to %s: %s\n", text, iscsi_get_error(l->iscsi));
		return -1;
	}
	struct scsi_task *task = iscsi_readcapacity16_sync(l->iscsi, l->url->lun);
	struct scsi_readcapacity16 *capacity = NULL;
	if (task && task->status == SCSI_STATUS_GOOD)
		capacity = scsi_datain_unmarshall(task);
	if (!capacity) {
		fprintf(stderr, "READ CAPACITY(16) of %s failed\n", text);
		return -1;
	}
	l->block_bytes = capacity->block_length;
	task = iscsi_inquiry_sync(l->iscsi, l->url->lun, 1,
				  SCSI_INQUIRY_PAGECODE_DEVICE_IDENTIFICATION, 255);
	struct scsi_inquiry_device_identification *ids = NULL;
	if (task && task->status == SCSI_STATUS_GOOD)
		ids = scsi_datain_unmarshall(task);
	if (!ids) {
		fprintf(stderr, "INQUIRY VPD 0x83 of %s failed\n", text);
		return -1;
	}
	l->naa_len = 0;
	for (struct scsi_inquiry_device_designator *d = ids->designators; d; d = d->next) {
		if (d->designator_type == SCSI_DESIGNATOR_TYPE_NAA &&
		    d->association == SCSI_ASSOCIATION_LOGICAL_UNIT &&
		    d->designator_length <= (int)sizeof l->naa) {
			memcpy(l->naa, d->designator, d->designator_length);
			l->naa_len = d->designator_length;
			break;
		}
	}
	if (!l->naa_len) {
		fprintf(stderr, "%s reports no NAA designator for its LUN\n", text);
		return -1;
	}
	return 0;
}

static void put_be(unsigned char *at, uint64_t value, int bytes)
{
	for (int i = 0; i < bytes; i++)
		at[i] = (unsigned char)(value >> (8 * (bytes - 1 - i)));
}

/* An identification copy target descriptor naming `l` by NAA. */
static void put_target(unsigned char *p, const struct lun *l)
{
	memset(p, 0, TARGET_BYTES);
	p[0] = 0xE4;
	p[4] = 0x01; /* binary code set */
	p[5] = 0x03; /* associated with the LUN, NAA designator */
	p[7] = (unsigned char)l->naa_len;
	memcpy(p + 8, l->naa, l->naa_len);
	put_be(p + 29, l->block_bytes, 3);
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: %s DST_URL DST_LBA SRC_URL SRC_LBA BLOCKS [COMMAND_BLOCKS]\n", argv[0]);
		return 2;
	}
	uint64_t dst_lba = strtoull(argv[2], NULL, 0);
	uint64_t src_lba = strtoull(argv[4], NULL, 0);
	uint64_t blocks = strtoull(argv[5], NULL, 0);
	uint64_t command_blocks = argc > 6 ? strtoull(argv[6], NULL, 0) : 32768;
	uint64_t command_max = (uint64_t)SEGMENT_BLOCKS_MAX * SEGMENTS_MAX;
	if (command_blocks == 0 || command_blocks > command_max) {
		fprintf(stderr, "COMMAND_BLOCKS must be 1..%llu\n", (unsigned long long)command_max);
		return 2;
	}
	struct lun dst, src;
	if (lun_open(argv[1], "iqn.2026-11.io.tessera.test:xcopy-dst", &dst) ||
	    lun_open(argv[3], "iqn.2026-11.io.tessera.test:xcopy-src", &src))
		return 1;
	if (dst.block_bytes != src.block_bytes) {
		fprintf(stderr, "the LUNs' block sizes differ\n");
		return 1;
	}

	unsigned char list[HEADER_BYTES + 2 * TARGET_BYTES + SEGMENTS_MAX * SEGMENT_BYTES];
	struct timespec start, end;
	clock_gettime(CLOCK_MONOTONIC, &start);
	int commands = 0;
	for (uint64_t done = 0; done < blocks;) {
		uint64_t command = blocks - done < command_blocks ? blocks - done : command_blocks;
		memset(list, 0, sizeof list);
		put_target(list + HEADER_BYTES, &src);
		put_target(list + HEADER_BYTES + TARGET_BYTES, &dst);
		int segments = 0;
		for (uint64_t at = 0; at < command; segments++) {
			uint64_t n = command - at < SEGMENT_BLOCKS_MAX ? command - at : SEGMENT_BLOCKS_MAX;
			unsigned char *s = list + HEADER_BYTES + 2 * TARGET_BYTES + SEGMENT_BYTES * segments;
			s[0] = 0x02;
			put_be(s + 2, SEGMENT_BYTES - 4, 2);
			put_be(s + 4, 0, 2); /* source: first target descriptor */
			put_be(s + 6, 1, 2); /* destination: second */
			put_be(s + 10, n, 2);
			put_be(s + 12, src_lba + done + at, 8);
			put_be(s + 20, dst_lba + done + at, 8);
			at += n;
		}
		list[1] = 0x18; /* no list identifier kept */
		put_be(list + 2, 2 * TARGET_BYTES, 2);
		put_be(list + 8, (uint64_t)SEGMENT_BYTES * segments, 4);
		struct iscsi_data data = {
			.size = HEADER_BYTES + 2 * TARGET_BYTES + SEGMENT_BYTES * segments,
			.data = list,
		};
		struct scsi_task *task = iscsi_extended_copy_sync(dst.iscsi, dst.url->lun, &data);
		if (!task || task->status != SCSI_STATUS_GOOD) {
			fprintf(stderr, "EXTENDED COPY of %llu blocks at block %llu failed: %s\n",
				(unsigned long long)command, (unsigned long long)done,
				iscsi_get_error(dst.iscsi));
			return 1;
		}
		scsi_free_scsi_task(task);
		commands++;
		done += command;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	double seconds = (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) / 1e9;
	printf("xcopy %.1f MiB in %.3f s with %d commands\n",
	       (double)(blocks * dst.block_bytes) / (1 << 20), seconds, commands);
	return 0;
}
