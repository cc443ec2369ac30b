//! Eviction and block memory: [`Cache::evict`] drops the least recently used clean
//! blocks above the capacity, and block memory is taken from and recycled into
//! `State::free` ([`State::new_block`], [`State::recycle`]), a few buffers of it;
//! the rest goes back to the kernel.
//!
//! Relies on the rule in `mod.rs` ("Rules that keep data safe") that dirty blocks
//! live apart from the LRU of clean ones and are never evicted: only `State::clean`
//! is trimmed here, so the cache holds more than its capacity only when its dirty
//! blocks alone exceed it.

use crate::device::blockmem::{self, BlockMem};
use crate::device::Backend;

use super::{Block, Cache, State, BLOCK, FREE_KEEP};

impl<B: Backend> Cache<B> {
    pub(super) fn evict(&self, st: &mut State) {
        let cap = self.cap_blocks();
        while st.len() + st.fetching_mem > cap {
            match st.clean.pop_lru() {
                Some((_, blk)) => st.recycle(blk),
                None => break,
            }
        }
    }
}

impl State {
    /// Block memory: a recycled buffer, or one of a new batch (see [`blockmem`]).
    /// The memory in use is at most the blocks held and those fetches in flight
    /// read into (bounded together by the capacity), the kept free buffers, and
    /// one batch.
    pub(super) fn take_mem(&mut self) -> BlockMem {
        if self.free.is_empty() {
            self.free
                .extend(BlockMem::batch(blockmem::BATCH, BLOCK as usize));
        }
        self.free.pop().expect("just refilled")
    }

    /// A new empty block. Sector contents of a new block are never read before
    /// they are marked valid.
    pub(super) fn new_block(&mut self) -> Block {
        Block {
            data: self.take_mem(),
            valid: 0,
            dirty: 0,
            gen: 0,
            touched: None,
        }
    }

    /// A new block holding `content` (one whole block), all of it valid.
    pub(super) fn new_block_from(&mut self, content: &[u8]) -> Block {
        let mut data = self.take_mem();
        data.copy_from_slice(content);
        Block::clean(data)
    }

    /// Ends the count of `blocks` fetched into memory of their own (see
    /// `fetching_mem`): they are cached or freed now.
    pub(super) fn fetch_landed(&mut self, blocks: usize) {
        self.fetching_mem -= blocks;
    }

    /// Returns block memory taken for a read that did not use it: it is kept
    /// whatever [`FREE_KEEP`] says, since the fetch that follows takes it again.
    pub(super) fn give_back_mem(&mut self, mem: impl IntoIterator<Item = BlockMem>) {
        self.free.extend(mem);
    }

    /// Keeps block memory for reuse, up to [`FREE_KEEP`] buffers, and gives the
    /// rest back.
    pub(super) fn free_mem(&mut self, mem: impl IntoIterator<Item = BlockMem>) {
        for m in mem {
            if self.free.len() < FREE_KEEP {
                self.free.push(m);
            }
        }
    }

    /// Keeps a freed block's buffer for reuse, or gives its memory back.
    pub(super) fn recycle(&mut self, blk: Block) {
        if self.free.len() < FREE_KEEP {
            self.free.push(blk.data);
        }
    }
}

impl Block {
    /// A clean block of `data`, every sector of it valid.
    pub(super) fn clean(data: BlockMem) -> Block {
        Block {
            data,
            valid: u128::MAX,
            dirty: 0,
            gen: 0,
            touched: None,
        }
    }
}
