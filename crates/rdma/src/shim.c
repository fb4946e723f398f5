/* The C side of bw-rdma: every rdma-core structure is read and written
 * here, so the Rust side sees opaque pointers and the flat structs below
 * only. Functions return 0 or a negative errno. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define BW_PDATA_MAX 196

struct bw_cm_event {
	int32_t event;
	int32_t status;
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t private_data_len;
	uint8_t private_data[BW_PDATA_MAX];
};

struct bw_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t with_invalidate;
};

struct bw_queue {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
};

static int neg_errno(void)
{
	return errno ? -errno : -EIO;
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return neg_errno();
	return 0;
}

int bw_channel_create(struct rdma_event_channel **out)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		return neg_errno();
	int r = set_nonblock(ch->fd);
	if (r) {
		rdma_destroy_event_channel(ch);
		return r;
	}
	*out = ch;
	return 0;
}

void bw_channel_destroy(struct rdma_event_channel *ch)
{
	rdma_destroy_event_channel(ch);
}

int bw_channel_fd(struct rdma_event_channel *ch)
{
	return ch->fd;
}

/* One event, copied out and acknowledged (private data included, so the
 * caller holds nothing of librdmacm's). -EAGAIN when none is waiting. */
int bw_get_event(struct rdma_event_channel *ch, struct bw_cm_event *out)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		return neg_errno();
	memset(out, 0, sizeof(*out));
	out->event = ev->event;
	out->status = ev->status;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	if (ev->id && ev->id->ps == RDMA_PS_TCP) {
		const struct rdma_conn_param *p = &ev->param.conn;
		out->responder_resources = p->responder_resources;
		out->initiator_depth = p->initiator_depth;
		uint8_t n = p->private_data_len;
		if (n > BW_PDATA_MAX)
			n = BW_PDATA_MAX;
		if (p->private_data && n) {
			memcpy(out->private_data, p->private_data, n);
			out->private_data_len = n;
		}
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static int parse_addr(const char *ip, uint16_t port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, ip, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons(port);
		return 0;
	}
	if (inet_pton(AF_INET6, ip, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(port);
		return 0;
	}
	return -EINVAL;
}

int bw_listen(struct rdma_event_channel *ch, const char *ip, uint16_t port, int backlog,
	      struct rdma_cm_id **out, uint16_t *bound_port)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	int r = parse_addr(ip, port, &ss);
	if (r)
		return r;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return neg_errno();
	if (rdma_bind_addr(id, (struct sockaddr *)&ss) || rdma_listen(id, backlog)) {
		r = neg_errno();
		rdma_destroy_id(id);
		return r;
	}
	*bound_port = ntohs(rdma_get_src_port(id));
	*out = id;
	return 0;
}

int bw_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **out)
{
	if (rdma_create_id(ch, out, NULL, RDMA_PS_TCP))
		return neg_errno();
	return 0;
}

int bw_resolve_addr(struct rdma_cm_id *id, const char *ip, uint16_t port, int timeout_ms)
{
	struct sockaddr_storage ss;
	int r = parse_addr(ip, port, &ss);
	if (r)
		return r;
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, timeout_ms))
		return neg_errno();
	return 0;
}

int bw_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	if (rdma_resolve_route(id, timeout_ms))
		return neg_errno();
	return 0;
}

int bw_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch)
{
	if (rdma_migrate_id(id, ch))
		return neg_errno();
	return 0;
}

void bw_destroy_id(struct rdma_cm_id *id)
{
	rdma_destroy_id(id);
}

/* The peer's address as text, for logs. */
int bw_peer_addr(struct rdma_cm_id *id, char *buf, int len)
{
	struct sockaddr *sa = rdma_get_peer_addr(id);
	const void *src;
	if (sa->sa_family == AF_INET)
		src = &((struct sockaddr_in *)sa)->sin_addr;
	else if (sa->sa_family == AF_INET6)
		src = &((struct sockaddr_in6 *)sa)->sin6_addr;
	else
		return -EAFNOSUPPORT;
	if (!inet_ntop(sa->sa_family, src, buf, len))
		return neg_errno();
	return 0;
}

/* Protection domain, completion channel, one CQ for sends and receives,
 * and the RC queue pair on `id`. */
int bw_queue_create(struct rdma_cm_id *id, uint32_t send_wr, uint32_t recv_wr, struct bw_queue **out)
{
	struct bw_queue *q = calloc(1, sizeof(*q));
	int r = -ENOMEM;
	if (!q)
		return r;
	q->id = id;
	q->pd = ibv_alloc_pd(id->verbs);
	if (!q->pd)
		goto fail;
	q->cc = ibv_create_comp_channel(id->verbs);
	if (!q->cc)
		goto fail;
	if ((r = set_nonblock(q->cc->fd)))
		goto fail_r;
	q->cq = ibv_create_cq(id->verbs, (int)(send_wr + recv_wr), NULL, q->cc, 0);
	if (!q->cq)
		goto fail;
	if (ibv_req_notify_cq(q->cq, 0))
		goto fail;
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = q->cq;
	a.recv_cq = q->cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = recv_wr;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, q->pd, &a))
		goto fail;
	*out = q;
	return 0;
fail:
	r = neg_errno();
fail_r:
	if (q->cq)
		ibv_destroy_cq(q->cq);
	if (q->cc)
		ibv_destroy_comp_channel(q->cc);
	if (q->pd)
		ibv_dealloc_pd(q->pd);
	free(q);
	return r;
}

/* Teardown is in two steps: the queue pair first (nothing more reaches
 * the buffers), then the caller deregisters its buffers, then the rest. */
void bw_queue_destroy_qp(struct bw_queue *q)
{
	rdma_destroy_qp(q->id);
}

void bw_queue_free(struct bw_queue *q)
{
	ibv_destroy_cq(q->cq);
	ibv_destroy_comp_channel(q->cc);
	ibv_dealloc_pd(q->pd);
	free(q);
}

static void clamp_rd(struct bw_queue *q, uint8_t *responder, uint8_t *initiator)
{
	struct ibv_device_attr d;
	if (ibv_query_device(q->id->verbs, &d))
		return;
	if (*responder > d.max_qp_rd_atom)
		*responder = (uint8_t)d.max_qp_rd_atom;
	if (*initiator > d.max_qp_init_rd_atom)
		*initiator = (uint8_t)d.max_qp_init_rd_atom;
}

static void conn_param(struct rdma_conn_param *p, const void *pdata, uint8_t len,
		       uint8_t responder, uint8_t initiator)
{
	memset(p, 0, sizeof(*p));
	p->private_data = pdata;
	p->private_data_len = len;
	p->responder_resources = responder;
	p->initiator_depth = initiator;
	p->flow_control = 1;
	p->retry_count = 7;
	p->rnr_retry_count = 7;
}

int bw_accept(struct bw_queue *q, const void *pdata, uint8_t len, uint8_t responder, uint8_t initiator)
{
	struct rdma_conn_param p;
	clamp_rd(q, &responder, &initiator);
	conn_param(&p, pdata, len, responder, initiator);
	if (rdma_accept(q->id, &p))
		return neg_errno();
	return 0;
}

int bw_connect(struct bw_queue *q, const void *pdata, uint8_t len, uint8_t responder, uint8_t initiator)
{
	struct rdma_conn_param p;
	clamp_rd(q, &responder, &initiator);
	conn_param(&p, pdata, len, responder, initiator);
	if (rdma_connect(q->id, &p))
		return neg_errno();
	return 0;
}

int bw_reject(struct rdma_cm_id *id, const void *pdata, uint8_t len)
{
	if (rdma_reject(id, pdata, len))
		return neg_errno();
	return 0;
}

int bw_disconnect(struct rdma_cm_id *id)
{
	if (rdma_disconnect(id))
		return neg_errno();
	return 0;
}

/* access bits: 1 the device writes it (RECV, RDMA READ into it), 2 the
 * peer may RDMA READ it, 4 the peer may RDMA WRITE it; 0: the device only
 * reads it (a SEND or RDMA WRITE source). */
int bw_reg_mr(struct bw_queue *q, void *addr, size_t len, int bits, struct ibv_mr **out,
	      uint32_t *lkey, uint32_t *rkey)
{
	int access = 0;
	if (bits & 1)
		access |= IBV_ACCESS_LOCAL_WRITE;
	if (bits & 2)
		access |= IBV_ACCESS_REMOTE_READ;
	if (bits & 4)
		access |= IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *mr = ibv_reg_mr(q->pd, addr, len, access);
	if (!mr)
		return neg_errno();
	*out = mr;
	*lkey = mr->lkey;
	*rkey = mr->rkey;
	return 0;
}

void bw_dereg_mr(struct ibv_mr *mr)
{
	ibv_dereg_mr(mr);
}

int bw_post_recv(struct bw_queue *q, uint64_t wr_id, void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return -ibv_post_recv(q->id->qp, &wr, &bad);
}

/* kind: 0 SEND, 1 SEND with invalidate (of `rkey`), 2 RDMA WRITE, 3 RDMA READ. */
int bw_post_send(struct bw_queue *q, int kind, uint64_t wr_id, void *addr, uint32_t len, uint32_t lkey,
		 uint64_t remote_addr, uint32_t rkey, int signaled)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = len ? 1 : 0;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	switch (kind) {
	case 0:
		wr.opcode = IBV_WR_SEND;
		break;
	case 1:
		wr.opcode = IBV_WR_SEND_WITH_INV;
		wr.invalidate_rkey = rkey;
		break;
	case 2:
	case 3:
		wr.opcode = kind == 2 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
		wr.wr.rdma.remote_addr = remote_addr;
		wr.wr.rdma.rkey = rkey;
		break;
	default:
		return -EINVAL;
	}
	return -ibv_post_send(q->id->qp, &wr, &bad);
}

int bw_poll(struct bw_queue *q, struct bw_wc *out, int n)
{
	struct ibv_wc wc[16];
	if (n > 16)
		n = 16;
	int got = ibv_poll_cq(q->cq, n, wc);
	if (got < 0)
		return -EIO;
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].with_invalidate = (wc[i].wc_flags & IBV_WC_WITH_INV) != 0;
	}
	return got;
}

/* Take the completion channel's event (if one is there) and ask for the
 * next: after this, poll the CQ again before sleeping on the fd. */
int bw_rearm(struct bw_queue *q)
{
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(q->cc, &cq, &ctx) == 0)
		ibv_ack_cq_events(cq, 1);
	return -ibv_req_notify_cq(q->cq, 0);
}

int bw_cq_fd(struct bw_queue *q)
{
	return q->cc->fd;
}

const char *bw_event_str(int event)
{
	return rdma_event_str(event);
}

const char *bw_wc_status_str(int status)
{
	return ibv_wc_status_str(status);
}
