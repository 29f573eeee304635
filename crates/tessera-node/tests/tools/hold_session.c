/*
 * hold_session: an iSCSI initiator that logs in to a LUN, says "logged in",
 * waits for a line on standard input, then writes one block at LBA 0 and
 * reports how the target answered: what a hypervisor's session does while a
 * volume is deleted under it.
 *
 *   hold_session URL
 *
 * Exits 0 if the write succeeded, 1 if the target refused it (status and
 * sense printed), 2 if the session could not be set up.
 *
 * Build: cc -O2 -o hold_session hold_session.c -liscsi (Debian libiscsi-dev).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: hold_session URL\n");
		return 2;
	}
	struct iscsi_context *iscsi =
		iscsi_create_context("iqn.2026-11.io.tessera:hold-session");
	if (!iscsi) {
		fprintf(stderr, "no iSCSI context\n");
		return 2;
	}
	struct iscsi_url *url = iscsi_parse_full_url(iscsi, argv[1]);
	if (!url) {
		fprintf(stderr, "%s: %s\n", argv[1], iscsi_get_error(iscsi));
		return 2;
	}
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
	if (iscsi_full_connect_sync(iscsi, url->portal, url->lun) != 0) {
		fprintf(stderr, "login: %s\n", iscsi_get_error(iscsi));
		return 2;
	}
	printf("logged in\n");
	fflush(stdout);
	char line[64];
	if (!fgets(line, sizeof line, stdin)) {
		return 2;
	}
	unsigned char block[512];
	memset(block, 0x5a, sizeof block);
	struct scsi_task *task = iscsi_write16_sync(iscsi, url->lun, 0, block,
						    sizeof block, 512, 0, 0, 0,
						    0, 0);
	if (!task) {
		printf("write failed: %s\n", iscsi_get_error(iscsi));
		return 1;
	}
	if (task->status != SCSI_STATUS_GOOD) {
		printf("write refused: status 0x%02x sense key 0x%x asc 0x%02x ascq 0x%02x\n",
		       task->status, task->sense.key, task->sense.ascq >> 8,
		       task->sense.ascq & 0xff);
		return 1;
	}
	printf("written\n");
	return 0;
}
