/* SPDX-License-Identifier: GPL-2.0 */
/* The C API the module binds to; bindgen turns it into bindings_generated.rs. */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/io.h>
#include <linux/dma-mapping.h>
#include <linux/delay.h>
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/interrupt.h>
#include <linux/eventfd.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/mm_types.h>
#include <linux/pgtable.h>
#include <linux/iommu.h>

/* What the module needs from the kernel's configuration (its version is checked in Kbuild). */
#if !defined(CONFIG_X86_64) || !IS_ENABLED(CONFIG_PCI_MSI) || !IS_ENABLED(CONFIG_DMA_SHARED_BUFFER) || \
	!IS_ENABLED(CONFIG_EVENTFD) || !defined(CONFIG_NEED_SG_DMA_LENGTH)
#error "ugds needs an x86-64 kernel with CONFIG_PCI_MSI, CONFIG_DMA_SHARED_BUFFER, CONFIG_EVENTFD and CONFIG_NEED_SG_DMA_LENGTH"
#endif

/*
 * VMA flag values as constants bindgen can read: 7.3 defines VM_* through INIT_VM_FLAG(), an
 * expression bindgen cannot evaluate (the kernel's own bindings do the same, RUST_CONST_HELPER_).
 */
const vm_flags_t UGDS_VM_WRITE = VM_WRITE;
const vm_flags_t UGDS_VM_SHARED = VM_SHARED;
const vm_flags_t UGDS_VM_MAYWRITE = VM_MAYWRITE;
const vm_flags_t UGDS_VM_IO = VM_IO;
const vm_flags_t UGDS_VM_PFNMAP = VM_PFNMAP;
const vm_flags_t UGDS_VM_DONTEXPAND = VM_DONTEXPAND;
const vm_flags_t UGDS_VM_DONTCOPY = VM_DONTCOPY;
const vm_flags_t UGDS_VM_DONTDUMP = VM_DONTDUMP;
