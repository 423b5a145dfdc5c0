/*
 * The fleet's placement and lost-node takeover (issue 24), as the code
 * implements it, checked with spin (test/model/model_test.go runs it).
 *
 * What is modelled, and where it lives in the code:
 *  - The database (internal/manager): each transaction is one atomic step
 *    (PostgreSQL runs them SERIALIZABLE: they commit as if one at a time),
 *    except Place, which runs READ COMMITTED with row locks: a plain read
 *    of the nodes (one step), then, per node tried, the lock of its row,
 *    the check again on the row as committed now, and if it fits the
 *    writes and the commit (one step: the row stays locked to the commit,
 *    and no reader sees the writes before it); a node that no longer fits
 *    is passed over for another the read said fits (BUG_NO_RECHECK: the
 *    read trusted, as a READ COMMITTED placement without the lock would).
 *    Which fitting node is tried is left open (the code takes the least
 *    loaded, or another when other placements hold that one's row). The
 *    rows that name the candidate (sandbox, reservation) are written
 *    before its row is locked, but no one sees them before the commit, so
 *    they belong to the last step.
 *      Place/placeTx/reserveNode (placement.go), FinishPlacedClaim + holdsTx and
 *      PublishPlacedHead + publishHeadTx (takeover.go, store.go),
 *      RequestRelease/beginReleaseTx, FinishPlacedRelease and
 *      returnReservation (placement.go, store.go), MarkLostNodes/loseNodeTx
 *      and RegisterNode (nodes.go), TakeOverLost/takeOver and ReleaseStale
 *      (takeover.go), Abandoned (nodes.go).
 *  - Each node's process (internal/nodeagent): a worker that takes the
 *    node's pending operations (NodeWork: by the reservation's node),
 *    drives its ctld and records the answer (claim, release), and a
 *    heartbeat loop that registers the node again once it was marked lost
 *    (then releaseAbandoned and ReleaseStale). The two run concurrently,
 *    as the goroutines do.
 *  - Each node's ctld: which generations physically run there (phys),
 *    and each block generation's writer, which may try to publish a head
 *    at any time (the pause path's PublishPlacedHead, or any late write of
 *    a node that was lost and came back).
 *  - The environment: creates from concurrent clients of two replicas,
 *    destroys, and a node's heartbeat lapsing (SIGSTOP, partition: any
 *    ready node, at any time; at most MAXLOSS times) seen by the sweep.
 *
 * Capacity is one dimension (a sandbox takes 1 of its node's CAP): the
 * check is the same in every dimension (NodeAlloc.Fits). Not modelled:
 * pause/resume (a writer's publish stands for any), a claim ctld refuses
 * (the model asserts it never has to for capacity), unclean proofs
 * (capacity withheld), the shared block store's own head CAS as a
 * separate step (it compares the same writer epochs, the generations: a
 * fleet claim carries its generation as RootFS.WriterEpoch and raises the
 * store's head to it before its writer starts, internal/node/blockroot
 * fence.go; so from then on the store refuses what ACCEPTS refuses),
 * one worker per node (the real one runs up to 8 operations, one per
 * sandbox). The quiescence check sees only the runs that reach quiescence.
 *
 * Checked in every state (the never claim): no node's reservations exceed its
 * allocatable; each node's reserved sum is exactly its active reservations
 * (never counted twice, never lost); a generation that still runs on its
 * ctld keeps its reservation (capacity returns only after the release);
 * no ctld runs more than its allocatable; at most one running writer of a
 * root would have its publish accepted. Checked at each accepted publish:
 * it is the sandbox's newest generation (a stale writer's publish is
 * refused), and heads move forward. Checked when nothing can move any more
 * (timeout): no ctld runs a generation the database does not give it (an
 * orphan no one will release, or a sandbox lost for good while it runs).
 *
 * Bug variants (each must fail; model_test.go checks that they do):
 *  BUG_NO_RECHECK      Place reserving on the node its plain read chose,
 *                      without checking the locked row again.
 *  BUG_NO_FENCE        PublishPlacedHead without holdsTx and without the
 *                      head's writer epoch check (seq only).
 *  BUG_NO_HOLDS + BUG_TAKEOVER_NO_ROW  the epoch CAS alone, as the
 *                      takeover wrote it before session 18.
 *  BUG_REGISTRATION_ONLY  the node process's reconcile before session 18.
 * And, passing: BUG_NO_HOLDS, BUG_NO_EPOCH (either fence alone suffices).
 */

/* The sizes (the PICK and invariant macros below are written out for them) */
#define NN 2	/* nodes */
#define NS 2	/* sandboxes, one create each */
#define NG 3	/* generation numbers 1..NG-1 (0: none) */
#ifndef CAP0
#define CAP0 1
#endif
#ifndef CAP1
#define CAP1 1
#endif
#ifndef MAXLOSS
#define MAXLOSS 1
#endif
#define NONE 255

/* sandbox states (api.State*) */
#define S_NONE 0
#define S_CLAIMING 1
#define S_READY 2
#define S_RELEASING 3
#define S_RELEASED 4
#define S_FAILED 5
#define S_LOST 6

/* operation states */
#define O_NONE 0
#define O_PEND 1
#define O_DONE 2
#define O_FAIL 3

/* node states */
#define N_READY 1
#define N_LOST 2

#define IX(s, g) ((s) * NG + (g))

/* ---- the database ---- */
byte cap[NN];		/* alloc_sandboxes */
byte reserved[NN];	/* reserved_sandboxes: the sum placement reads */
byte nstate[NN];

bool block[NS];		/* root mode block (else overlay) */
byte sstate[NS];
byte gstate[NS * NG];	/* generations.state */
byte sgen[NS];
byte snode[NS];

byte rnode[NS * NG];	/* the reservation of s/g: its node (NONE: none) */
bool ractive[NS * NG];	/* not released_at */
byte claimop[NS * NG];	/* the claim operation of s/g */
byte relop[NS * NG];	/* the release operation of s/g */

byte headseq[NS];	/* heads table (0: no row) */
byte headepoch[NS];
bool headrow[NS];
byte base[NS * NG];	/* the head seq generation g starts from (ExpectHead) */

/* ---- the nodes ---- */
bool phys[NS * NG];	/* the generation runs on its node's ctld */
bool ran[NS * NG];	/* ctld made it once (a release of it finds it released) */
bool published[NS * NG];	/* its writer tried its one publish */

byte losses;

/* Scratch of the atomic steps (loop counters, sums): not part of the
 * state, as no value of theirs outlives its step. */
hidden byte wn, ws, wt, wt2, ci, rs, rg, ks, kg, ps, pg, hc, hn, hs, hg, hw, qs, qg, hi;

/* ---- helpers (each used inside an atomic step) ---- */

/* choose (placement.go): the least loaded ready node with room, lowest id on ties. */
inline choose(out) {
	out = NONE;
	ci = 0;
	do
	:: ci < NN ->
		if
		:: nstate[ci] == N_READY && reserved[ci] + 1 <= cap[ci] ->
			if
			:: out == NONE -> out = ci
			:: out != NONE && (reserved[ci] + 1) * cap[out] < (reserved[out] + 1) * cap[ci] -> out = ci
			:: else -> skip
			fi
		:: else -> skip
		fi;
		ci++
	:: else -> break
	od
}

/* placeTx's writes: generation g of s on node n, its claim and reservation. */
inline reserve(s, g, n, from) {
	sgen[s] = g; snode[s] = n; sstate[s] = S_CLAIMING; gstate[IX(s, g)] = S_CLAIMING;
	claimop[IX(s, g)] = O_PEND;
	rnode[IX(s, g)] = n; ractive[IX(s, g)] = true;
	base[IX(s, g)] = from;
	reserved[n]++
}

/* returnReservation: ends s/g's reservation if still active. */
inline giveBack(s, g) {
	if
	:: ractive[IX(s, g)] ->
		ractive[IX(s, g)] = false;
		reserved[rnode[IX(s, g)]]--
	:: else -> skip
	fi
}

/* A step's first statement picks what it works on among the candidates
 * that qualify (a select() followed by a guard would block on a wrong
 * pick). Written out for NN 2, NS 2, NG 3. */
#define PICK2(C, s, g) if :: C(0, 1) -> s = 0; g = 1 :: C(0, 2) -> s = 0; g = 2 :: C(1, 1) -> s = 1; g = 1 :: C(1, 2) -> s = 1; g = 2 fi
#define PICK1(C, x, N) if :: C(0) -> x = 0 :: C(1) -> x = 1 fi
#define WORK(s, g) (rnode[IX(s, g)] == n && (claimop[IX(s, g)] == O_PEND || relop[IX(s, g)] == O_PEND))
#define PUB(s, g) (block[s] && phys[IX(s, g)] && rnode[IX(s, g)] == n && !published[IX(s, g)])
#define LOSE(x) (losses < MAXLOSS && nstate[x] == N_READY)
#define TAKE(x) (sstate[x] == S_LOST && nstate[snode[x]] == N_LOST && sgen[x] + 1 < NG)

/* holdsTx: node n holds s's current generation g. */
#define HOLDS(n, s, g) (snode[s] == (n) && sgen[s] == (g) && sstate[s] != S_LOST)

/* Would PublishPlacedHead(n, s, g, seq) be accepted now? */
#if defined(BUG_NO_FENCE)
#define ACCEPTS(n, s, g, seq) ((seq) > headseq[s])
#elif defined(BUG_NO_HOLDS)
#define ACCEPTS(n, s, g, seq) ((seq) > headseq[s] && (g) >= headepoch[s])
#elif defined(BUG_NO_EPOCH)
#define ACCEPTS(n, s, g, seq) (HOLDS(n, s, g) && (seq) > headseq[s])
#else
#define ACCEPTS(n, s, g, seq) (HOLDS(n, s, g) && (seq) > headseq[s] && (g) >= headepoch[s])
#endif

/* ReleaseStale(n): a pending release for every generation n still holds a
 * reservation of while the database gives the sandbox to another. */
inline releaseStale(n) {
	rs = 0;
	do
	:: rs < NS ->
		rg = 1;
		do
		:: rg < NG ->
			if
			:: ractive[IX(rs, rg)] && rnode[IX(rs, rg)] == n && (sgen[rs] != rg || snode[rs] != n) && relop[IX(rs, rg)] != O_PEND ->
				relop[IX(rs, rg)] = O_PEND;
				printf("MSC: stale %d/%d: release\n", rs, rg)
			:: else -> skip
			fi;
			rg++
		:: else -> break
		od;
		rs++
	:: else -> break
	od
}

/* ---- counts ---- */

inline countActive(n, c) {
	ks = 0;
	c = 0;
	do
	:: ks < NS ->
		kg = 1;
		do
		:: kg < NG ->
			if :: ractive[IX(ks, kg)] && rnode[IX(ks, kg)] == n -> c++ :: else -> skip fi;
			kg++
		:: else -> break
		od;
		ks++
	:: else -> break
	od
}

inline countPhys(n, c) {
	ps = 0;
	c = 0;
	do
	:: ps < NS ->
		pg = 1;
		do
		:: pg < NG ->
			if :: phys[IX(ps, pg)] && rnode[IX(ps, pg)] == n -> c++ :: else -> skip fi;
			pg++
		:: else -> break
		od;
		ps++
	:: else -> break
	od
}

/* Checked in every state (the claim runs in lockstep with the system).
 * Written out for NN 2, NS 2, NG 3. */
#define B(x) ((x) -> 1 : 0)
#define ACT(s, g, n) B(ractive[IX(s, g)] && rnode[IX(s, g)] == (n))
#define RUNS(s, g, n) B(phys[IX(s, g)] && rnode[IX(s, g)] == (n))
#define ACTIVE(n) (ACT(0, 1, n) + ACT(0, 2, n) + ACT(1, 1, n) + ACT(1, 2, n))
#define RUNNING(n) (RUNS(0, 1, n) + RUNS(0, 2, n) + RUNS(1, 1, n) + RUNS(1, 2, n))
/* capacity returns only once the generation is gone */
#define HELD(s, g) (!phys[IX(s, g)] || ractive[IX(s, g)])
/* a running writer of s whose publish would be accepted now */
#define WRITER(s, g) B(phys[IX(s, g)] && block[s] && !published[IX(s, g)] && ACCEPTS(rnode[IX(s, g)], s, g, base[IX(s, g)] + 1))
#define NODEOK(n) (reserved[n] <= cap[n] && reserved[n] == ACTIVE(n) && RUNNING(n) <= cap[n])

/* never overcommitted, never double-counted, no ctld over its capacity;
 * reservations held while running */
#define CAPACITY (NODEOK(0) && NODEOK(1) && HELD(0, 1) && HELD(0, 2) && HELD(1, 1) && HELD(1, 2))
/* at most one running writer per root would have its publish accepted */
#define ONE_WRITER (WRITER(0, 1) + WRITER(0, 2) <= 1 && WRITER(1, 1) + WRITER(1, 2) <= 1)

never {
	do
	:: assert(CAPACITY); assert(ONE_WRITER)
	od
}

/* When nothing can move any more, no ctld runs a generation the database
 * does not give it: nobody would ever release it, or the sandbox would
 * stay lost or failed while it runs. */
active proctype quiescent() {
	timeout -> atomic {
		qs = 0;
		do
		:: qs < NS ->
			qg = 1;
			do
			:: qg < NG ->
				assert(!phys[IX(qs, qg)] || (sgen[qs] == qg && snode[qs] == rnode[IX(qs, qg)] && sstate[qs] == S_READY));
				qg++
			:: else -> break
			od;
			qs++
		:: else -> break
		od
	}
}

/* ---- the replicas' clients ---- */

/* A replica's client: a create of sandbox s (Place), then perhaps its
 * destroy (RequestRelease); then the same for sandbox next (NONE: none). */
proctype client(byte s; byte next) {
	byte seen[NN];	/* the plain read: each ready node's reserved sum (NONE: not ready, or passed over) */
	byte n;
	bool ok;
place:
	atomic {	/* reserveNode's plain read of the ready nodes */
		hi = 0;
		do
		:: hi < NN -> if :: nstate[hi] == N_READY -> seen[hi] = reserved[hi] :: else -> seen[hi] = NONE fi; hi++
		:: else -> break
		od
	}
try:
	atomic {	/* a node the read says fits; its row locked, checked again as committed now; the writes and the commit */
		if
		:: seen[0] != NONE && seen[0] + 1 <= cap[0] -> n = 0
		:: seen[1] != NONE && seen[1] + 1 <= cap[1] -> n = 1
		:: else -> n = NONE	/* capacity_exhausted */
		fi;
		ok = false;
		if
		:: n != NONE ->
#ifdef BUG_NO_RECHECK
			ok = true;
#else
			ok = nstate[n] == N_READY && reserved[n] + 1 <= cap[n];
#endif
			if
			:: ok ->
				reserve(s, 1, n, 0);
				printf("MSC: place %d/1 on node %d\n", s, n);
				assert(reserved[n] <= cap[n])	/* never overcommitted */
			:: else -> seen[n] = NONE	/* passed over: try another */
			fi
		:: else -> skip
		fi;
		if :: ok || n == NONE -> seen[0] = 0; seen[1] = 0 :: else -> skip fi
	}
	if
	:: n == NONE -> goto end
	:: !ok -> goto try
	:: else -> skip
	fi;
	/* The destroy, or none. beginReleaseTx: refused while a claim is
	 * pending or when released; the caller retries. */
	if
	:: true -> goto end
	:: true
	fi;
	atomic {
		(claimop[IX(s, sgen[s])] != O_PEND) ->
		if
		:: sstate[s] != S_RELEASED && relop[IX(s, sgen[s])] != O_PEND && relop[IX(s, sgen[s])] != O_DONE ->
			sstate[s] = S_RELEASING;
			relop[IX(s, sgen[s])] = O_PEND;
			printf("MSC: destroy %d/%d requested\n", s, sgen[s])
		:: else -> skip
		fi
	}
end:
	if
	:: next != NONE -> s = next; next = NONE; n = 0; goto place
	:: else
	fi
}

/* ---- the node processes ---- */

/* The worker: carries out the node's pending operations (NodeWork lists
 * them by the node of the generation's reservation; the answer is
 * recorded in a later transaction than the one that listed it), and its
 * ctld's writers' publishes. */
proctype worker(byte n) {
	byte s, g;
	bool claim, ok;
end:
	do
	:: atomic {	/* NodeWork */
		PICK2(WORK, s, g);
		claim = claimop[IX(s, g)] == O_PEND;
		printf("MSC: node %d takes %d/%d %d\n", n, s, g, claim)
	   };
	   if
	   :: claim ->
		atomic {	/* ctld's claim (idempotent by operation id) */
			if
			:: !phys[IX(s, g)] && !ran[IX(s, g)] ->
				/* the database never asks a ctld for more than it has */
				countPhys(n, hc);
				assert(hc < cap[n]);
				phys[IX(s, g)] = true;
				ran[IX(s, g)] = true;
				printf("MSC: ctld %d claimed %d/%d\n", n, s, g)
			:: else -> skip
			fi
		};
		atomic {	/* FinishPlacedClaim */
			if
			:: claimop[IX(s, g)] == O_PEND && HOLDS(n, s, g) ->
				claimop[IX(s, g)] = O_DONE;
				gstate[IX(s, g)] = S_READY;
				sstate[s] = S_READY;
				printf("MSC: claim %d/%d recorded\n", s, g)
			:: else -> printf("MSC: claim %d/%d fenced\n", s, g); releaseStale(n)	/* fenced: release what is stale */
			fi;
			s = 0; g = 0; claim = false
		}
	   :: else ->
		atomic {	/* ctld's release */
			ok = phys[IX(s, g)];
			phys[IX(s, g)] = false;
			printf("MSC: ctld %d released %d/%d (had it: %d)\n", n, s, g, ok)
		};
		atomic {
			if
			:: ok || ran[IX(s, g)] ->
				/* FinishPlacedRelease: the proof verifies; or ctld had
				 * released it already (conflict: FinishPlacedNodeRelease) */
				if
				:: relop[IX(s, g)] == O_PEND ->
					relop[IX(s, g)] = O_DONE;
					printf("MSC: release %d/%d recorded\n", s, g);
					gstate[IX(s, g)] = S_RELEASED;
					if :: sgen[s] == g -> sstate[s] = S_RELEASED :: else -> skip fi;
					giveBack(s, g)
				:: else -> skip	/* not pending: refused, nothing recorded */
				fi
			:: else ->
				/* ctld never had it: not_found, definitive: FailOperation */
				if
				:: relop[IX(s, g)] == O_PEND ->
					relop[IX(s, g)] = O_FAIL;
					printf("MSC: release %d/%d failed (not found)\n", s, g);
#ifdef BUG_FAILOP_ANY_GEN	/* before session 18: any generation's */
					sstate[s] = gstate[IX(s, g)]
#else	/* the sandbox goes back to its generation's state if current */
					if :: sgen[s] == g -> sstate[s] = gstate[IX(s, g)] :: else -> skip fi
#endif
				:: else -> skip
				fi
			fi;
			s = 0; g = 0; ok = false
		}
	   fi
	/* a running block writer publishes a head (once per generation) */
	:: atomic {
		PICK2(PUB, s, g);
		published[IX(s, g)] = true;
		if
		:: ACCEPTS(n, s, g, base[IX(s, g)] + 1) ->
			/* a stale writer's publish is refused */
			assert(g == sgen[s]);
			assert(base[IX(s, g)] + 1 > headseq[s] && g >= headepoch[s]);
			headseq[s] = base[IX(s, g)] + 1;
			headepoch[s] = g;
			headrow[s] = true;
			printf("MSC: head of %d: seq %d by %d/%d\n", s, headseq[s], n, g)
		:: else -> printf("MSC: head of %d by %d/%d fenced\n", s, n, g)
		fi
	   }
	od
}

/* The heartbeat loop: a node marked lost registers again and releases
 * its stale generations (ReleaseStale). At registration and at every
 * heartbeat after it (reconcile), it asks its ctld about what the
 * database failed or lost there: a failed generation ctld still runs is
 * released (releaseAbandoned); a lost block generation ctld still runs is
 * the sandbox's again (readoptLost). BUG_REGISTRATION_ONLY: the code
 * before session 18 (no readopt; releaseAbandoned at registration only):
 * the quiescent check finds a block sandbox lost for good while it runs. */
#define ABANDONED(x) (snode[x] == n && sstate[x] == S_FAILED && ractive[IX(x, sgen[x])] && phys[IX(x, sgen[x])] && \
	claimop[IX(x, sgen[x])] != O_PEND && relop[IX(x, sgen[x])] != O_PEND)
#define READOPT(x) (snode[x] == n && sstate[x] == S_LOST && phys[IX(x, sgen[x])] && rnode[IX(x, sgen[x])] == n)
proctype beat(byte n) {
	byte s;
end:
	do
	:: atomic {
		nstate[n] == N_LOST ->
		nstate[n] = N_READY;	/* RegisterNode */
		printf("MSC: node %d registers again\n", n)
	   };
#ifdef BUG_REGISTRATION_ONLY
	   s = 0;
	   do
	   :: s < NS ->
		atomic {
			if
			:: ABANDONED(s) ->
				sstate[s] = S_RELEASING;
				relop[IX(s, sgen[s])] = O_PEND;
				printf("MSC: abandoned %d/%d: release\n", s, sgen[s])
			:: else -> skip
			fi
		};
		s++
	   :: else -> break
	   od;
#endif
	   atomic { releaseStale(n); s = 0 }
#ifndef BUG_REGISTRATION_ONLY
	/* reconcile: Abandoned, ctld's Get, BeginRelease */
	:: atomic {
		nstate[n] == N_READY && (ABANDONED(0) || ABANDONED(1)) ->
		PICK1(ABANDONED, s, NS);
		sstate[s] = S_RELEASING;
		relop[IX(s, sgen[s])] = O_PEND;
		printf("MSC: abandoned %d/%d: release\n", s, sgen[s]);
		s = 0
	   }
	/* reconcile: LostOn, ctld's Get, ReadoptLost */
	:: atomic {
		nstate[n] == N_READY && (READOPT(0) || READOPT(1)) ->
		PICK1(READOPT, s, NS);
		if
		:: relop[IX(s, sgen[s])] == O_PEND -> sstate[s] = S_RELEASING; gstate[IX(s, sgen[s])] = S_READY
		:: relop[IX(s, sgen[s])] != O_PEND && claimop[IX(s, sgen[s])] == O_PEND -> sstate[s] = S_CLAIMING; gstate[IX(s, sgen[s])] = S_CLAIMING
		:: else -> sstate[s] = S_READY; gstate[IX(s, sgen[s])] = S_READY
		fi;
		printf("MSC: lost %d/%d runs on node %d: readopted\n", s, sgen[s], n);
		s = 0
	   }
#endif
	od
}

/* The sweep (every node process runs it): a node whose heartbeat lapsed
 * is marked lost; lost block sandboxes are taken over. */
proctype sweep() {
end:
	do
	/* MarkLostNodes: a ready node's heartbeat lapsed */
	:: atomic {
		PICK1(LOSE, wn, NN);
		losses++;
		nstate[wn] = N_LOST;
		printf("MSC: node %d lost\n", wn);
		ws = 0;
		do
		:: ws < NS ->
			if
			:: snode[ws] == wn && (sstate[ws] == S_CLAIMING || sstate[ws] == S_READY || sstate[ws] == S_RELEASING) ->
				if
				:: block[ws] -> sstate[ws] = S_LOST; gstate[IX(ws, sgen[ws])] = S_LOST
				:: else ->
					sstate[ws] = S_FAILED; gstate[IX(ws, sgen[ws])] = S_FAILED;
					/* its pending operations fail */
					if :: claimop[IX(ws, sgen[ws])] == O_PEND -> claimop[IX(ws, sgen[ws])] = O_FAIL :: else -> skip fi;
					if :: relop[IX(ws, sgen[ws])] == O_PEND -> relop[IX(ws, sgen[ws])] = O_FAIL :: else -> skip fi
				fi
			:: else -> skip
			fi;
			ws++
		:: else -> break
		od
	   }
	/* TakeOverLost: one lost block sandbox of a lost node, if a node has room */
	:: atomic {
		PICK1(TAKE, ws, NS);
		choose(wt);
		if
		:: wt != NONE ->
			if :: claimop[IX(ws, sgen[ws])] == O_PEND -> claimop[IX(ws, sgen[ws])] = O_FAIL :: else -> skip fi;
			if :: relop[IX(ws, sgen[ws])] == O_PEND -> relop[IX(ws, sgen[ws])] = O_FAIL :: else -> skip fi;
			wt2 = sgen[ws] + 1;	/* (inline arguments are text) */
			reserve(ws, wt2, wt, headseq[ws]);
			printf("MSC: take over %d as %d/%d on node %d\n", ws, ws, sgen[ws], wt);
			/* the new writer epoch: the heads row is written even if the
			 * sandbox never published (BUG_TAKEOVER_NO_ROW: only an
			 * existing row was raised, as before session 18) */
#ifdef BUG_TAKEOVER_NO_ROW
			if :: headrow[ws] && headepoch[ws] < sgen[ws] -> headepoch[ws] = sgen[ws] :: else -> skip fi
#else
			if :: headepoch[ws] < sgen[ws] -> headepoch[ws] = sgen[ws] :: else -> skip fi;
			headrow[ws] = true
#endif
		:: else -> skip	/* no room: tried again later */
		fi
	   }
	od
}

init {
	byte i;
	atomic {
		cap[0] = CAP0; cap[1] = CAP1;
		nstate[0] = N_READY; nstate[1] = N_READY;
		block[0] = true; block[1] = false;
		i = 0;
		do :: i < NS -> snode[i] = NONE; i++ :: else -> break od;
		i = 0;
		do :: i < NS * NG -> rnode[i] = NONE; i++ :: else -> break od;
		run worker(0); run worker(1);
		run beat(0); run beat(1);
		run sweep();
		run client(0, NONE); run client(1, NONE)
	}
}
